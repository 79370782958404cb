"""Experiments: what a case runs per batch of trials and which exact laws its observations follow.

An experiment declares its checks (an exact null law over cells, the probability that a trial
contributes an observation, and the layer it belongs to) and turns a batch of trials into counts per
check plus any certain violations (an observation no correct sampler can produce).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.laws import MAX_JOINT_CELLS, step_joint_cells
from specwatch.protocol import Layer
from specwatch.sampling import Sampler, SpecOutput, SpecStep, TargetRaised, sample_rows, uniforms


@dataclass(frozen=True)
class CheckSpec:
    """One test: an exact null law over cells, the probability that a trial contributes an observation,
    its layer, and whether it is ``designed`` (sets the trial cap and counts for ``powered``; a check of
    the step's joint law over many cells runs and counts in the Bonferroni m without sizing the run)."""

    name: str
    layer: Layer
    null: NDArray[np.float64]
    #: Observations a trial contributes on average (the probability that it reaches the position, or the
    #: number of positions a long-horizon check tests per trial).
    reach: float
    designed: bool = True

    @property
    def support(self) -> int:
        return int((self.null > 0).sum())


@dataclass(frozen=True)
class Violation:
    """An observation impossible under the reference law: refutes it with certainty."""

    layer: Layer
    message: str


@dataclass(frozen=True)
class CoverageDesign:
    """What a speculative end-to-end case is built to exercise: some verification of at least
    ``min_drafts`` drafts, one accepting all of them and one accepting some but not all (partial), and
    at least ``min_rounds`` verification rounds in every call."""

    min_drafts: int = 2
    min_rounds: int = 3


@dataclass(frozen=True)
class Coverage:
    """Histograms of what the library did, observed by wrapping its own calls: drafts per verification,
    accepted drafts per verification and verification rounds per call, plus the verifications of at least
    two drafts that accepted all (``full``) or some but not all (``partial``) of them."""

    drafts: dict[int, int] = field(default_factory=dict)
    accepted: dict[int, int] = field(default_factory=dict)
    rounds: dict[int, int] = field(default_factory=dict)
    full: int = 0
    partial: int = 0

    def merge(self, other: Coverage) -> Coverage:
        def add(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
            return {k: a.get(k, 0) + b.get(k, 0) for k in sorted(set(a) | set(b))}

        return Coverage(
            add(self.drafts, other.drafts),
            add(self.accepted, other.accepted),
            add(self.rounds, other.rounds),
            self.full + other.full,
            self.partial + other.partial,
        )

    def shortfalls(self, design: CoverageDesign) -> list[str]:
        """What the design asked for and the observed calls did not reach (empty: coverage reached)."""
        missing = []
        if max(self.drafts, default=0) < design.min_drafts:
            missing.append(f"no verification had {design.min_drafts} or more drafts (drafts {self.drafts})")
        if not self.full:
            missing.append(f"no verification of >= 2 drafts accepted all of them (accepted {self.accepted})")
        if not self.partial:
            missing.append("no verification of >= 2 drafts accepted some but not all of them")
        if not self.rounds or min(self.rounds) < design.min_rounds:
            missing.append(f"a call had fewer than {design.min_rounds} verification rounds (rounds {self.rounds})")
        return missing

    def to_dict(self, design: CoverageDesign) -> dict[str, Any]:
        """JSON form (string keys), with the design and what fell short of it."""
        return {
            "drafts": {str(k): v for k, v in self.drafts.items()},
            "accepted": {str(k): v for k, v in self.accepted.items()},
            "rounds": {str(k): v for k, v in self.rounds.items()},
            "full": self.full,
            "partial": self.partial,
            "design": {"min_drafts": design.min_drafts, "min_rounds": design.min_rounds},
            "shortfalls": self.shortfalls(design),
        }


@dataclass(frozen=True)
class Observation:
    counts: dict[str, NDArray[np.int64]]
    violations: tuple[Violation, ...]
    accepted_total: int
    sample: bytes
    #: What the library's drafting did in this batch (speculative end-to-end experiments only).
    coverage: Coverage | None = None
    #: Expected accepted drafts of the batch, for experiments whose expectation depends on the path taken (the
    #: sum of Σ min(p, q) over the drafts counted in ``accepted_total``); None: ``expected_acceptance`` holds.
    expected_accepted: float | None = None


class Experiment(Protocol):
    @property
    def checks(self) -> Sequence[CheckSpec]: ...

    @property
    def expected_acceptance(self) -> float | None: ...

    @property
    def accepted_per_trial_max(self) -> int | None:
        """B such that every trial's accepted count lies in [0, B] whatever the sampler does within the
        experiment's design (what the acceptance drift bound needs); None: the experiment measures no acceptance."""

    @property
    def fixed_trials(self) -> int | None:
        """A fixed number of trials (deterministic checks), or None to let the planner size the cap."""

    def run(self, n: int, generator: torch.Generator) -> Observation: ...


def _bincount(values: torch.Tensor, size: int) -> NDArray[np.int64]:
    return torch.bincount(values, minlength=size).cpu().numpy().astype(np.int64)


class ChainExperiment:
    """Trials of one context-free chain step through a sampler under test.

    Checks: ``lossless/pos{t}`` (token at t given t emitted ~ p_t), ``conformance/pos{t}`` ((accepted?,
    token) at draft position t given reached ~ [m_t, (p_t - q_t)_+]) and ``conformance/K`` (K law), and
    the joint law of the step where it stays within ``MAX_JOINT_CELLS`` cells: ``lossless/joint`` (the
    step completed to gamma + 1 tokens by fresh draws from p_t ~ prod_t p_t) or, beyond, ``lossless/pair{t}``
    (completed tokens t, t + 1 ~ p_t x p_{t+1}); ``conformance/joint`` ((K, Y_1..Y_{K+1}) ~ the Leviathan
    law). The joint checks are not ``designed``: they count in the Bonferroni m but do not size the run.
    Certain violations found here: malformed output, ids out of range, an emitted prefix that differs
    from the drafts, drafts outside the support of q (the runner adds observations in null-probability
    cells of any check, e.g. an emitted token with p_t = 0). An exception of the sampler is raised as
    ``TargetRaised``.
    """

    #: Fingerprint probe: one vectorised batch is cheap.
    probe_trials = 1024

    def __init__(self, step: SpecStep, sampler: Sampler) -> None:
        self.step = step
        self.sampler = sampler
        law = step.law
        self._law = law
        gamma = step.gamma
        checks = [CheckSpec(f"lossless/pos{t + 1}", Layer.LOSSLESS, law.emitted(t), float(law.reach[t])) for t in range(gamma + 1)]
        checks += [
            CheckSpec(f"conformance/pos{t + 1}", Layer.CONFORMANCE, law.position_joint(t), float(law.reach[t])) for t in range(gamma)
        ]
        checks.append(CheckSpec("conformance/K", Layer.CONFORMANCE, law.k_law, 1.0))
        vocab = step.vocab_size
        self._joint = vocab ** (gamma + 1) <= MAX_JOINT_CELLS
        self._pairs = not self._joint and vocab**2 <= MAX_JOINT_CELLS
        if self._joint:
            checks.append(CheckSpec("lossless/joint", Layer.LOSSLESS, law.completed_joint(), 1.0, designed=False))
        elif self._pairs:
            checks += [CheckSpec(f"lossless/pair{t + 1}", Layer.LOSSLESS, law.completed_pair(t), 1.0, designed=False) for t in range(gamma)]
        self._step_joint = step_joint_cells(vocab, gamma) <= MAX_JOINT_CELLS
        if self._step_joint:
            checks.append(CheckSpec("conformance/joint", Layer.CONFORMANCE, law.step_joint(), 1.0, designed=False))
        self._checks = tuple(c for c in checks if c.reach > 0)
        self._draft_support = step.draft_probs > 0

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return self._checks

    @property
    def expected_acceptance(self) -> float:
        return self._law.expected_accepted

    @property
    def accepted_per_trial_max(self) -> int:
        """gamma: a step accepts at most its drafts (a larger ``n_accepted`` is a certain violation)."""
        return self.step.gamma

    @property
    def fixed_trials(self) -> None:
        return None

    def run(self, n: int, generator: torch.Generator) -> Observation:
        try:
            out = self.sampler(self.step, n, generator)
        except Exception as exc:
            raise TargetRaised(exc) from exc
        violations = self._structural_violations(out, n)
        if violations:
            return Observation({}, violations, 0, b"")
        return self._observe(out, generator)

    def _structural_violations(self, out: SpecOutput, n: int) -> tuple[Violation, ...]:
        gamma, vocab = self.step.gamma, self.step.vocab_size
        shapes = {"drafts": (n, gamma), "tokens": (n, gamma + 1), "n_accepted": (n,)}
        for name, shape in shapes.items():
            tensor = getattr(out, name)
            if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape:
                got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                return (Violation(Layer.LOSSLESS, f"output {name} has shape {got}, expected {shape}"),)
            if tensor.dtype.is_floating_point or tensor.dtype == torch.bool:
                return (Violation(Layer.LOSSLESS, f"output {name} must hold integer ids, got {tensor.dtype}"),)
        k = out.n_accepted.long()
        if bool(((k < 0) | (k > gamma)).any()):
            return (Violation(Layer.LOSSLESS, f"n_accepted outside [0, {gamma}]"),)
        drafts, tokens = out.drafts.long(), out.tokens.long()
        cols = torch.arange(gamma + 1, device=tokens.device)
        emitted = cols <= k[:, None]
        found: list[Violation] = []
        if bool(((tokens < 0) | (tokens >= vocab))[emitted].any()):
            found.append(Violation(Layer.LOSSLESS, f"an emitted token id is outside [0, {vocab})"))
        elif bool((tokens[~emitted] != -1).any()):
            found.append(Violation(Layer.LOSSLESS, "tokens after the emitted ones are not -1 padding"))
        elif bool(((tokens[:, :gamma] != drafts) & (cols[:gamma] < k[:, None])).any()):
            found.append(Violation(Layer.LOSSLESS, "an accepted token differs from the draft it accepts"))
        if bool(((drafts < 0) | (drafts >= vocab)).any()):
            found.append(Violation(Layer.CONFORMANCE, f"a draft id is outside [0, {vocab})"))
        return tuple(found)

    def _observe(self, out: SpecOutput, generator: torch.Generator) -> Observation:
        gamma, vocab = self.step.gamma, self.step.vocab_size
        k = out.n_accepted.long()
        drafts, tokens = out.drafts.long(), out.tokens.long()
        violations: list[Violation] = []
        counts: dict[str, NDArray[np.int64]] = {}
        for t in range(gamma + 1):
            counts[f"lossless/pos{t + 1}"] = _bincount(tokens[k >= t, t], vocab)
        for t in range(gamma):
            bad = ~self._draft_support[t][drafts[:, t]]
            if bool(bad.any()):
                token = int(drafts[:, t][bad][0])
                violations.append(Violation(Layer.CONFORMANCE, f"draft {token} at position {t + 1} has draft probability 0"))
            reached = k >= t
            cell = tokens[reached, t] + vocab * (k[reached] == t).long()
            counts[f"conformance/pos{t + 1}"] = _bincount(cell, 2 * vocab)
        counts["conformance/K"] = _bincount(k, gamma + 1)
        if self._joint or self._pairs:
            fresh = sample_rows(self.step.target_probs, uniforms(len(k), gamma + 1, generator, tokens.device))
            cols = torch.arange(gamma + 1, device=tokens.device)
            completed = torch.where(cols <= k[:, None], tokens, fresh)
            if self._joint:
                weights = vocab ** torch.arange(gamma, -1, -1, device=tokens.device)
                counts["lossless/joint"] = _bincount((completed * weights).sum(dim=1), vocab ** (gamma + 1))
            else:
                for t in range(gamma):
                    counts[f"lossless/pair{t + 1}"] = _bincount(completed[:, t] * vocab + completed[:, t + 1], vocab * vocab)
        if self._step_joint:
            counts["conformance/joint"] = _bincount(self._step_cell(tokens, k), step_joint_cells(vocab, gamma))
        sample = tokens[: min(len(tokens), 256)].cpu().numpy().astype(np.int64).tobytes()
        return Observation(counts, tuple(violations), int(k.sum()), sample)

    def _step_cell(self, tokens: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Cell of (K, Y_1..Y_{K+1}) in ``ChainLaw.step_joint``'s order."""
        gamma, vocab = self.step.gamma, self.step.vocab_size
        cell = torch.zeros_like(k)
        offset = torch.zeros_like(k)
        for j in range(gamma + 1):
            emitted = j <= k
            cell = torch.where(emitted, cell * vocab + tokens[:, j].clamp(min=0), cell)
            offset = torch.where(j < k, offset + vocab ** (j + 1), offset)
        return offset + cell
