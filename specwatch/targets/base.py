"""The adapter kit: what every library target shares, so that a target's package only fills it in.

- :class:`Adapter`: what a target's adapter class offers (``load``, ``describe``, ``sampler``, ``cases``; ``prepare``
  for a variant such as ``transformers+mutant:NAME``), loaded by :mod:`specwatch.targets.registry` when its target runs;
- :class:`AdapterError`: the one error an adapter raises for a library it cannot adapt (a :class:`TargetError`:
  the command line reports it in one line, exit 2);
- :func:`bind_keywords`: a library function's keyword arguments, bound by name from its signature (never by
  position: a parameter added in a release cannot take another's value);
- :func:`refusing_sampler`: the direct sampler of a release without the function the direct cases call;
- :class:`LibraryExperiment`: an experiment's defaults (no checks, no acceptance, trials sized by the planner);
- the end-to-end pieces of a target that generates with its engine: :func:`e2e_checks` (the first tokens' joint law
  and every token of a horizon against its conditional law), :func:`e2e_draws` (a seed per request and the PIT's
  uniforms), :func:`joint_cell` and :func:`conditional_pit`; :func:`rounds_coverage`, drafts and accepted drafts per
  verification round as a path reports them; :class:`ForwardExperiment`, the engine's forward against the float64
  reference (the models themselves: :mod:`specwatch.targets.tiny`); :class:`GreedyEquivalence`, a path at temperature 0
  against greedy decoding of the reference, token for token; :func:`library_call`, a call into the library whose
  exception is a finding (:class:`TargetRaised`) unless it is the path's own refusal.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata
from typing import Any, Literal, Protocol, Self, TypeVar

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.cases import Case
from specwatch.conditional import PIT_BINS, TokenOrder, conditional_batch, pit_null
from specwatch.experiments import CheckSpec, Coverage, CoverageDesign, Observation, Violation
from specwatch.protocol import Layer, LibraryIdentity
from specwatch.sampling import Sampler, SpecOutput, SpecStep, TargetRaised
from specwatch.targets import TargetError


class AdapterError(TargetError):
    """The installed library cannot be adapted: a missing entry point, an unknown required argument, a lossy default."""


class Adapter(ABC):
    """What a target's adapter offers, found by looking at the installed library (never by version tables)."""

    @classmethod
    @abstractmethod
    def load(cls) -> Self:
        """The installed library, adapted; :class:`AdapterError` when it cannot be imported or adapted."""

    @classmethod
    def prepare(cls, variant: str) -> None:
        """Apply ``variant`` (the part of a target spec after ``+``) before :meth:`load`; a target without
        variants refuses every one."""
        raise TargetError(f"this target has no variants, got {variant!r}")

    @abstractmethod
    def describe(self) -> LibraryIdentity:
        """The library's identity: its name, distribution, version, path and what else shapes its behaviour here."""

    @abstractmethod
    def sampler(self) -> Sampler:
        """The direct cases' sampler (:func:`refusing_sampler` where the release has none)."""

    @abstractmethod
    def cases(self) -> tuple[Case, ...]:
        """The cases this release runs (a path it lacks: skipped with the reason)."""


def distribution_version(distribution: str) -> str:
    """The installed version of ``distribution`` from its metadata, ``unknown`` where it has none."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def refusing_sampler(message: str) -> Sampler:
    """A sampler that raises :class:`AdapterError` with ``message`` (its direct cases then fail as ``raised``)."""

    def missing(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
        raise AdapterError(message)

    return missing


def bind_keywords(
    fn: Callable[..., Any],
    core: Mapping[str, Any],
    *,
    label: str,
    lossless: Mapping[str, Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
    required: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``fn`` (``label`` in errors) as the installed release spells it; :class:`AdapterError`
    where it cannot be called losslessly.

    - every name of ``core`` must be a parameter (given its value), and so must every name of ``required``;
    - ``fixed``: values given where ``fn`` has the parameter (with or without a default), left out where not;
    - ``lossless``: a parameter's single lossless value. Not given: it must default to exactly that value (type
      included) and is left at its default (unless ``fixed`` sets it); given: its default, where it has one, must
      equal the value;
    - any other parameter must have a default (it is left at it).
    """
    signature = inspect.signature(fn)
    params = signature.parameters
    lossless, fixed = lossless or {}, fixed or {}
    missing = [name for name in core if name not in params]
    if missing:
        raise AdapterError(f"{label} has no parameter(s) {missing}; signature {signature}")
    kwargs = dict(core)
    for name, value in (required or {}).items():
        if name not in params:
            raise AdapterError(f"{label} has no {name}: not in this release")
        kwargs[name] = value
    for name, param in params.items():
        if name in kwargs or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name in lossless:
            value = lossless[name]
            if param.default is param.empty or type(param.default) is not type(value) or param.default != value:
                raise AdapterError(f"{label}'s {name} defaults to {param.default!r}; the lossless path needs {value!r}")
        elif name not in fixed and param.default is param.empty:
            raise AdapterError(f"{label} requires unknown argument {name!r}; signature {signature}")
        if name in fixed:
            kwargs[name] = fixed[name]
    for name, value in lossless.items():
        default = params[name].default if name in core else inspect.Parameter.empty
        if default is not inspect.Parameter.empty and default != value:
            raise AdapterError(f"{label}'s {name} defaults to {default!r}; the lossless path needs {value!r}")
    return kwargs


class LibraryExperiment:
    """An experiment's defaults (:class:`specwatch.experiments.Experiment`): no checks, no acceptance measured, and
    the trial cap sized by the planner. A subclass overrides what it has."""

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return ()

    @property
    def expected_acceptance(self) -> float | None:
        return None

    @property
    def accepted_per_trial_max(self) -> int | None:
        return None

    @property
    def fixed_trials(self) -> int | None:
        return None


def pit_check(order: TokenOrder) -> str:
    """The name of the conditional check under token order ``order``: ``lossless/pit_id``, ``lossless/pit_prob``."""
    return f"lossless/pit_{order.value}"


def e2e_checks(law: NDArray[np.float64], *, length: int, horizon: int, designed: Literal["first", "pit"]) -> tuple[CheckSpec, ...]:
    """An end-to-end case's lossless checks: ``lossless/first{length}``, the joint law ``law`` of the first ``length``
    tokens (one observation a trial), and :func:`pit_check` per token order, every token of ``horizon`` against its
    exact conditional law (``horizon`` observations a trial). ``designed`` names the pair that sizes the run; the
    other rides along (:class:`CheckSpec`)."""
    return (
        CheckSpec(f"lossless/first{length}", Layer.LOSSLESS, law, 1.0, designed=designed == "first"),
        *(CheckSpec(pit_check(order), Layer.LOSSLESS, pit_null(), float(horizon), designed=designed == "pit") for order in TokenOrder),
    )


def trial_seeds(n: int, generator: torch.Generator) -> list[int]:
    """One seed a trial (a request's own seed), drawn from the case's generator: a run is reproducible from its seed."""
    seeds: list[int] = torch.randint(0, 2**31 - 1, (n,), generator=generator).tolist()
    return seeds


def e2e_draws(n: int, horizon: int, generator: torch.Generator) -> tuple[list[int], NDArray[np.float64]]:
    """A batch's draws, in this order: :func:`trial_seeds`, then the randomized PIT's uniforms (trials, horizon)."""
    seeds = trial_seeds(n, generator)
    pit_w: NDArray[np.float64] = torch.rand((n, horizon), generator=generator, dtype=torch.float64).numpy()
    return seeds, pit_w


def joint_cell(tokens: Sequence[int], vocab: int, length: int) -> int:
    """The cell of the first ``length`` tokens in their joint law: their base-``vocab`` number."""
    return sum(t * vocab ** (length - 1 - j) for j, t in enumerate(tokens[:length]))


def conditional_pit(
    trials: Iterable[tuple[Sequence[int], NDArray[np.float64], NDArray[np.bool_]]], pit_w: NDArray[np.float64]
) -> tuple[dict[TokenOrder, NDArray[np.int64]], tuple[Violation, ...]]:
    """PIT bin counts of every generated token per token order (:func:`specwatch.conditional.conditional_batch`), and
    a certain violation for the first token of conditional probability 0. ``trials``: per trial its output, the exact
    conditional law at each position (horizon, V) and the positions clear of float noise (``keep``)."""
    pit = {order: np.zeros(PIT_BINS, dtype=np.int64) for order in TokenOrder}
    impossible: tuple[Violation, ...] = ()
    for i, (out, rows, keep) in enumerate(trials):
        batch = conditional_batch(rows, np.asarray(out, dtype=np.int64), pit_w[i], keep=keep)
        for order in TokenOrder:
            pit[order] += batch.counts[order]
        if batch.impossible is not None and not impossible:
            impossible = (Violation(Layer.LOSSLESS, f"output {list(out)}: {batch.impossible}"),)
    return pit, impossible


class Rounds(Protocol):
    """A trial as a path reports it: ``rounds``, its verification rounds as ``(drafted, accepted)``, or None where the
    path could not observe them."""

    @property
    def rounds(self) -> Sequence[tuple[int, int]] | None: ...


def rounds_coverage(trials: Iterable[Rounds]) -> Coverage:
    """Drafts and accepted drafts per verification round, rounds per trial, and the rounds of 2 or more drafts that
    accepted all of them (full) or some but not all (partial); trials whose rounds were not observed are left out."""
    drafts: dict[int, int] = {}
    accepted: dict[int, int] = {}
    rounds: dict[int, int] = {}
    full = partial = 0
    for trial in trials:
        if trial.rounds is None:
            continue
        rounds[len(trial.rounds)] = rounds.get(len(trial.rounds), 0) + 1
        for d, a in trial.rounds:
            drafts[d] = drafts.get(d, 0) + 1
            accepted[a] = accepted.get(a, 0) + 1
            full += d >= 2 and a == d
            partial += d >= 2 and 0 < a < d
    return Coverage(dict(sorted(drafts.items())), dict(sorted(accepted.items())), dict(sorted(rounds.items())), full, partial)


class ForwardExperiment(LibraryExperiment):
    """The engine's forward of the tiny target against the float64 reference on random sequences of 4 to 39 tokens (one
    a trial): a difference above float32 noise (``tolerance``) means the laws would be computed from another function.
    ``difference``: the largest |engine logit - reference logit| over a sequence; ``engine`` names it in the message."""

    trials = 8
    probe_trials = 1

    def __init__(self, difference: Callable[[list[int]], float], *, vocab: int, tolerance: float, engine: str) -> None:
        self.difference, self.vocab, self.tolerance, self.engine = difference, vocab, tolerance, engine

    @property
    def fixed_trials(self) -> int:
        return self.trials

    def run(self, n: int, generator: torch.Generator) -> Observation:
        violations: list[Violation] = []
        worst = 0.0
        for _ in range(n):
            length = int(torch.randint(4, 40, (1,), generator=generator))
            tokens = torch.randint(0, self.vocab, (length,), generator=generator).tolist()
            worst = max(worst, difference := self.difference(tokens))
            if difference > self.tolerance and not violations:
                message = f"tokens {tokens}: {self.engine}'s logits differ from the reference by {difference:.3g}"
                violations.append(Violation(Layer.LOSSLESS, message))
        return Observation({}, tuple(violations), 0, np.asarray([worst > self.tolerance], dtype=np.int64).tobytes())


T = TypeVar("T")

#: Below this top-2 logit gap of the float64 reference, float32 noise could flip an argmax: the prompt is undecidable.
GREEDY_GAP = 1e-3


def library_call(call: Callable[[], T], refusal: type[Exception]) -> T:
    """``call()``, an exception from the library on a valid request raised as :class:`TargetRaised` (a finding), the
    path's own ``refusal`` (it cannot run this request: a configuration error, not a finding) as it is."""
    try:
        return call()
    except refusal:
        raise
    except Exception as exc:  # the library raised on a valid request: a finding
        raise TargetRaised(exc) from exc


class Emitted(Rounds, Protocol):
    """A call's trial as the greedy check reads it: the tokens it emitted and its rounds."""

    @property
    def tokens(self) -> Sequence[int]: ...


class GreedyEquivalence(LibraryExperiment, ABC):
    """Temperature 0: the path's output equals greedy decoding of the float64 reference, token for token, on random
    prompts (``prompts`` of them; one whose reference meets a top-2 gap under :data:`GREEDY_GAP` is left out). The
    first prompt that differs is the violation, named with both outputs. A subclass draws a prompt (``prompt``), gives
    the reference (``reference``) and calls its path (``call``, library errors as :func:`library_call` raises them);
    ``finish`` may refuse the calls as a whole (a path that never speculated). Coverage is recorded when the subclass
    sets a ``coverage_design``."""

    prompts = 48
    probe_trials = 8
    coverage_design: CoverageDesign | None = None
    #: How the path is named in a violation: "greedy [..] != <label> [..]".
    label = "speculative"

    @property
    def fixed_trials(self) -> int:
        return self.prompts

    @abstractmethod
    def prompt(self, generator: torch.Generator) -> list[int]:
        """See the class docstring."""

    @abstractmethod
    def reference(self, prompt: list[int]) -> tuple[list[int], float]:
        """See the class docstring."""

    @abstractmethod
    def call(self, prompt: list[int]) -> Emitted:
        """See the class docstring."""

    def finish(self, trials: Sequence[Emitted]) -> None:
        """Refuse the calls as a whole (raise), or accept them; by default accept."""

    def run(self, n: int, generator: torch.Generator) -> Observation:
        violations: list[Violation] = []
        sample: list[int] = []
        trials: list[Emitted] = []
        for _ in range(n):
            prompt = self.prompt(generator)
            expected, gap = self.reference(prompt)
            if gap < GREEDY_GAP:
                continue  # float noise could flip an argmax: undecidable, left out
            trials.append(self.call(prompt))
            got = list(trials[-1].tokens)
            sample += got
            if got != expected and not violations:
                violations.append(Violation(Layer.LOSSLESS, f"prompt {prompt}: greedy {expected} != {self.label} {got}"))
        self.finish(trials)
        coverage = rounds_coverage(trials) if self.coverage_design is not None else None
        return Observation({}, tuple(violations), 0, np.asarray(sample, dtype=np.int64).tobytes(), coverage)
