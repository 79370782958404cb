"""The sampler interface under test and the reference speculative sampler.

A sampler takes one chain step (target and draft logits with their processing), a number of
independent trials ``n`` and a private ``torch.Generator``, and returns the drafts it proposed, the
tokens it emitted and how many drafts it accepted, for every trial. The reference sampler is
Leviathan/Chen speculative sampling, vectorised over trials; it is the known-good target and the
oracle of the suite's self-tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Protocol

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.conditional import FLOAT32_MARGIN, MIN_REMOVED, processing_margin
from specwatch.laws import ChainLaw, sequence_law


class FixtureError(ValueError):
    """A processed fixture that would not test what it names (:meth:`Processing.fixture_law`)."""


@dataclass(frozen=True)
class Processing:
    """Logits processing in Hugging Face's warper order: temperature, then top-k, then top-p.

    top-k keeps every token tied with the k-th largest logit; top-p keeps the smallest set of
    most likely tokens whose probability reaches ``top_p`` (at least one token).
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError("top_k must be >= 1")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")

    @property
    def is_identity(self) -> bool:
        return self.temperature == 1.0 and self.top_k is None and self.top_p in (None, 1.0)

    def logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed logits (removed tokens set to -inf); the input is not modified."""
        out = logits / self.temperature
        if self.top_k is not None and self.top_k < out.shape[-1]:
            kth = torch.topk(out, self.top_k, dim=-1).values[..., -1:]
            out = out.masked_fill(out < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            sorted_logits, order = torch.sort(out, dim=-1, descending=False)
            cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            remove_sorted = cumulative <= 1.0 - self.top_p
            remove_sorted[..., -1] = False
            remove = remove_sorted.scatter(-1, order, remove_sorted)
            out = out.masked_fill(remove, float("-inf"))
        return out

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return self.logits(logits).softmax(dim=-1)

    def removed_mass(self, logits: torch.Tensor) -> tuple[float, float]:
        """Mass of one row removed by top-k from the tempered law, and by top-p from what top-k kept (0.0 for a
        processor that is not set): how much each processor really cuts on that row."""
        tempered = (logits / self.temperature).softmax(-1)
        after_k = Processing(temperature=self.temperature, top_k=self.top_k).probs(logits)
        after_p = self.probs(logits)
        return float(tempered[after_k == 0].sum()), float(after_k[(after_p == 0) & (after_k > 0)].sum())

    def fixture_law(self, next_logits: Callable[[tuple[int, ...]], torch.Tensor], length: int, vocab: int) -> NDArray[np.float64]:
        """The exact law of the first ``length`` tokens after this processing, from the raw next-token logits after
        each prefix (``next_logits``), refusing a fixture that would not test it (:class:`FixtureError`).

        Every row the law enumerates must be at least ``FLOAT32_MARGIN`` from a processing boundary (float noise in
        a library's float32 processing cannot change its support), and top-k and top-p, when set, must each remove
        at least ``MIN_REMOVED`` of its mass (top-k of the tempered law, top-p of what top-k kept): a processor that
        cuts nothing on a row is not tested there.
        """
        removed: list[tuple[float, float]] = []

        def oracle(prefix: tuple[int, ...]) -> NDArray[np.float64]:
            logits = next_logits(prefix).double().cpu()
            margin = processing_margin(logits.numpy(), self.temperature, self.top_k, self.top_p)
            if margin < FLOAT32_MARGIN:
                raise FixtureError(
                    f"prefix {prefix}: the processing boundary (top-k gap or top-p cut) is {margin:.2g} from a token, below "
                    f"{FLOAT32_MARGIN:g}: float noise could change the support; choose another fixture"
                )
            removed.append(self.removed_mass(logits))
            probs: NDArray[np.float64] = self.probs(logits).numpy()
            return probs

        law = sequence_law(oracle, length, vocab)
        for index, name, active in ((0, "top-k", self.top_k is not None), (1, "top-p", self.top_p not in (None, 1.0))):
            least = min((r[index] for r in removed), default=0.0)
            if active and least < MIN_REMOVED:
                raise FixtureError(
                    f"{name} removes only {least:.3g} of the mass on some enumerated row (< {MIN_REMOVED}): choose another fixture"
                )
        return law

    def describe(self) -> str:
        parts = []
        if self.temperature != 1.0:
            parts.append(f"T={self.temperature:g}")
        if self.top_k is not None:
            parts.append(f"top_k={self.top_k}")
        if self.top_p is not None:
            parts.append(f"top_p={self.top_p:g}")
        return ",".join(parts) or "none"


@dataclass(frozen=True)
class SpecStep:
    """One chain speculative step with context-free rows.

    ``target_logits``: (gamma + 1, V), the last row being the bonus position. ``draft_logits``:
    (gamma, V). Each side has its own processing; ``target_probs`` and ``draft_probs`` are the
    processed distributions the reference law is defined by (float64, on the step's device).
    """

    target_logits: torch.Tensor
    draft_logits: torch.Tensor
    target_processing: Processing = Processing()
    draft_processing: Processing = Processing()

    def __post_init__(self) -> None:
        t, d = self.target_logits, self.draft_logits
        if t.ndim != 2 or d.ndim != 2 or t.shape[0] != d.shape[0] + 1 or t.shape[1] != d.shape[1]:
            raise ValueError(f"target logits must be (gamma+1, V), draft (gamma, V); got {tuple(t.shape)}, {tuple(d.shape)}")
        if d.shape[0] < 1:
            raise ValueError("a step needs at least one draft position")

    @property
    def gamma(self) -> int:
        return int(self.draft_logits.shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.target_logits.shape[1])

    @property
    def device(self) -> torch.device:
        return self.target_logits.device

    @cached_property
    def target_probs(self) -> torch.Tensor:
        return self.target_processing.probs(self.target_logits.double())

    @cached_property
    def draft_probs(self) -> torch.Tensor:
        return self.draft_processing.probs(self.draft_logits.double())

    @cached_property
    def law(self) -> ChainLaw:
        return ChainLaw(self.target_probs.cpu().numpy(), self.draft_probs.cpu().numpy())

    def to(self, device: torch.device | str) -> SpecStep:
        return replace(self, target_logits=self.target_logits.to(device), draft_logits=self.draft_logits.to(device))


@dataclass(frozen=True)
class SpecOutput:
    """What a sampler returns for ``n`` trials of one step.

    ``drafts``: (n, gamma) proposed tokens. ``n_accepted``: (n,) accepted-prefix length K.
    ``tokens``: (n, gamma + 1) emitted tokens, the first K equal to the drafts, then one
    resampled or bonus token, then -1 padding.
    """

    drafts: torch.Tensor
    tokens: torch.Tensor
    n_accepted: torch.Tensor


class Sampler(Protocol):
    def __call__(self, step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput: ...


class TargetRaised(Exception):  # noqa: N818 - names what happened, like StopIteration
    """The code under test raised on a valid input: a finding about the sampler, not a broken run.

    Experiments raise it (``from`` the target's exception) around the call into the target, so the runner
    can tell it from a fault of the suite itself. ``str()`` is the original exception's type and message.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw one token per uniform in ``u`` from the 1-D distribution ``probs`` (unnormalised ok).

    Zero-probability tokens are never returned: a flat CDF step has an empty interval.
    """
    cdf = probs.cumsum(dim=-1)
    idx = torch.searchsorted(cdf, u * cdf[-1], right=True)
    last = int(torch.nonzero(probs > 0).max())
    return idx.clamp_(max=last)


def sample_rows(rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Column i of the result is drawn from rows[i] with the uniforms u[:, i]."""
    return torch.stack([inverse_cdf(rows[i], u[:, i]) for i in range(rows.shape[0])], dim=1)


def sample_by_row_index(rows: torch.Tensor, which: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Trial j gets a token drawn from rows[which[j]] with uniform u[j]."""
    out = torch.empty_like(which)
    for r in torch.unique(which).tolist():
        sel = which == r
        out[sel] = inverse_cdf(rows[r], u[sel])
    return out


def normalise_rows(rows: torch.Tensor) -> torch.Tensor:
    """Rows scaled to sum 1; an all-zero row stays zero (it is never sampled)."""
    mass = rows.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, rows / mass.clamp(min=torch.finfo(rows.dtype).tiny), rows)


def uniforms(n: int, k: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.rand((n, k), generator=generator, dtype=torch.float64, device=device)


def assemble(drafts: torch.Tensor, n_accepted: torch.Tensor, final: torch.Tensor) -> SpecOutput:
    """Emitted tokens: the first K drafts, then ``final`` at index K, then -1 padding."""
    n, gamma = drafts.shape
    cols = torch.arange(gamma + 1, device=drafts.device)
    padded = torch.cat((drafts, torch.full((n, 1), -1, dtype=drafts.dtype, device=drafts.device)), dim=1)
    tokens = torch.where(cols < n_accepted[:, None], padded, torch.full_like(padded, -1))
    tokens[torch.arange(n, device=drafts.device), n_accepted] = final
    return SpecOutput(drafts=drafts, tokens=tokens, n_accepted=n_accepted)


def at(rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(n, k) values rows[i, tokens[:, i]] for rows of shape (k, V) and tokens of shape (n, k)."""
    return rows.gather(1, tokens.T).T


def accepted_prefix(accept: torch.Tensor) -> torch.Tensor:
    """K = length of the leading run of accepted drafts."""
    return accept.long().cumprod(dim=1).sum(dim=1)


def reference_sampler(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """Leviathan/Chen speculative sampling of ``n`` independent trials of ``step``.

    Draft x_i ~ q_i; accept while u_i < p_i(x_i) / q_i(x_i); at the first rejection i emit
    y ~ norm((p_i - q_i)_+), after gamma acceptances emit the bonus y ~ p_{gamma+1}.
    Guarantee: lossless (each emitted position has law p_t). Reference: Leviathan et al. 2023,
    Algorithm 1; Chen et al. 2023, Algorithm 2.
    """
    p, q = step.target_probs, step.draft_probs
    gamma, device = step.gamma, step.device
    drafts = sample_rows(q, uniforms(n, gamma, generator, device))
    ratio = at(p[:gamma], drafts) / at(q, drafts)
    accept = uniforms(n, gamma, generator, device) < ratio
    n_accepted = accepted_prefix(accept)
    final_rows = torch.cat((normalise_rows((p[:gamma] - q).clamp(min=0)), p[gamma:]), dim=0)
    final = sample_by_row_index(final_rows, n_accepted, uniforms(n, 1, generator, device)[:, 0])
    return assemble(drafts, n_accepted, final)
