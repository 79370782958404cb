"""Runs cases: batches of trials until a check rejects, every designed check is done (the early pass) or the planned
cap, then a frozen result.

The evidence of a case and how it is judged live in :mod:`specwatch.evidence`; this module plans the
trials, draws the batches and assembles the run.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

import torch

from specwatch import CATALOGUE_VERSION, SUITE_VERSION
from specwatch.cases import Case
from specwatch.evidence import CaseEvidence, case_result, designed_checks, passed_early
from specwatch.experiments import Experiment
from specwatch.laws import validate_law
from specwatch.protocol import Acceptance, CaseResult, LibraryIdentity, Replay, RunResult, Verdict, run_verdict
from specwatch.provenance import derive_seed, device_name, environment, probe, probe_trials
from specwatch.reproducible import draw, experiment_max_batch, global_seed, seeded_globals
from specwatch.sampling import Sampler, TargetRaised
from specwatch.stats import (
    plan_test,
    rejection_threshold,
    trials_for_observations,
)

#: Every case is tested at this TV distance (or its own, when larger) under ``--quick`` (issue 39: 0.05, within 2 min for
#: transformers on 2 cores; docs/statistics.md, "Profiles").
QUICK_EPSILON = 0.05
#: The cap gives every designed check its planned observations except with this probability (binomial).
SHORTFALL_PROBABILITY = 1e-3
#: With the early pass, batches grow to at most cap / EARLY_PASS_LOOKS: a clean case stops within that part of
#: its cap after its checks pass (doubling to ``max_batch`` would leave half the cap between the last two looks).
EARLY_PASS_LOOKS = 32


@dataclass(frozen=True)
class SuiteConfig:
    """How a run is tested. ``alpha`` is the family-wise false-alarm budget of the whole run."""

    alpha: float = 1e-4
    beta: float = 1e-3
    epsilon: float | None = None
    quick: bool = False
    seed: int = 0
    attempt: int = 0
    device: str = "cpu"
    max_trials: int = 1 << 21
    first_batch: int = 1024
    max_batch: int = 1 << 16
    #: The most trials one call of the sampler gets (``max_batch`` of assert_lossless and check); None: sized to
    #: memory from the case's V and gamma (:func:`specwatch.reproducible.default_max_batch`).
    sampler_max_batch: int | None = None
    time_budget_s: float | None = None
    fail_fast: bool = False
    #: Stop a clean case before its cap once every designed check is done: its pass statistic reached 1 / early_pass_beta,
    #: or it has the observations its design plans (docs/statistics.md §7a): a bug of size >= epsilon is then missed with
    #: probability <= beta + early_pass_beta. False: every passing case runs to its cap.
    early_pass: bool = True
    early_pass_beta: float = 1e-3
    #: Cases run first with the seeds of attempt ``replay_attempt`` (an earlier run's inputs), then with this run's:
    #: a counterexample that run found is replayed before fresh inputs are drawn (the result's ``replay``).
    replay: frozenset[str] = frozenset()
    replay_attempt: int = 0

    def epsilon_for(self, case: Case) -> float:
        if self.epsilon is not None:
            return self.epsilon
        return max(case.epsilon, QUICK_EPSILON) if self.quick else case.epsilon


@dataclass(frozen=True)
class Progress:
    case_id: str
    index: int
    total: int
    trials: int
    cap: int
    log_e: float
    log_threshold: float


ProgressCallback = Callable[[Progress], None]


def planned_observations(experiment: Experiment, config: SuiteConfig, epsilon: float, threshold: float) -> dict[str, int]:
    """Each designed check's planned observations: those at which its e-process crosses ``threshold`` except with
    probability ``config.beta`` at TV ``epsilon`` (``stats.plan_test``, fixed-n; docs/statistics.md §7)."""
    level = 1.0 / threshold
    return {c.name: plan_test(c.support, c.reach, epsilon, level, config.beta).needed for c in designed_checks(experiment, epsilon)}


def trial_cap(experiment: Experiment, config: SuiteConfig, epsilon: float, threshold: float) -> int:
    """Trials that give every designed check its planned observations (power 1 - beta at TV ``epsilon`` at
    level 1 / ``threshold``) except with probability ``SHORTFALL_PROBABILITY``, within ``config.max_trials``."""
    if experiment.fixed_trials is not None:
        return experiment.fixed_trials
    wanted = 0.0
    planned = planned_observations(experiment, config, epsilon, threshold)
    for check in designed_checks(experiment, epsilon):
        needed = planned[check.name]
        wanted = max(wanted, trials_for_observations(needed, check.reach, SHORTFALL_PROBABILITY, limit=config.max_trials))
    # At least one first batch of trials, or what the experiment says is its least (``min_trials``: a few hundred
    # for generate() calls whose checks see many observations per trial).
    floor = min(config.first_batch, int(getattr(experiment, "min_trials", config.first_batch)))
    return int(min(config.max_trials, max(math.ceil(wanted), floor)))


def top_up(experiment: Experiment, state: CaseEvidence, config: SuiteConfig, *, epsilon: float, threshold: float, cap: int) -> int:
    """More trials for a designed check that reached the cap short of its planned observations, at the rate it has
    seen them (a long-horizon check leaves out rows within float noise of a processing boundary, so it sees a little
    less than ``reach`` per trial); at most ``cap`` more and within ``config.max_trials``. 0 when none is short.

    Stopping is still decided at batch ends from the data alone, so Ville's inequality keeps every check's level.
    """
    extra = 0
    for check, needed in planned_observations(experiment, config, epsilon, threshold).items():
        seen = int(state.counts[check].sum())
        if seen < needed and seen > 0:
            extra = max(extra, math.ceil((needed - seen) * state.trials / seen))
    return int(max(0, min(extra, cap, config.max_trials - state.trials)))


def validate_laws(experiment: Experiment) -> None:
    """ValueError naming the law unless every check's null is a probability law (finite, >= 0, sums to 1)."""
    for check in experiment.checks:
        validate_law(check.name, check.null)


def run_case(
    case: Case,
    experiment: Experiment,
    config: SuiteConfig,
    tests_in_run: int,
    *,
    index: int = 0,
    total: int = 1,
    progress: ProgressCallback | None = None,
) -> CaseResult:
    """:func:`run_case_once` with this run's seeds, after a replay with attempt ``config.replay_attempt``'s seeds when the
    case is in ``config.replay`` (the same inputs as that run: the same draws, prompts and uniforms, so a
    deterministic counterexample comes back), recorded in the result's ``replay``."""
    replay = None
    if case.id in config.replay and config.replay_attempt != config.attempt:
        earlier = replace(config, attempt=config.replay_attempt, replay=frozenset())
        replay = Replay.of(run_case_once(case, experiment, earlier, tests_in_run, index=index, total=total, progress=progress))
    result = run_case_once(case, experiment, config, tests_in_run, index=index, total=total, progress=progress)
    return result if replay is None else replace(result, replay=replay)


def run_case_once(
    case: Case,
    experiment: Experiment,
    config: SuiteConfig,
    tests_in_run: int,
    *,
    index: int = 0,
    total: int = 1,
    progress: ProgressCallback | None = None,
) -> CaseResult:
    """Sequentially test one case until a lossless check rejects, a certain violation, every designed check is done
    (with the early pass: passed or has its planned observations, none holding evidence), or the cap.

    Each check's e-process is compared with m / alpha (m = ``tests_in_run``) after every batch;
    monitoring at batch ends keeps Ville's guarantee, so the run's family-wise false-alarm rate is at
    most alpha. The cap gives every check power 1 - beta at the case's TV distance, unless it exceeds
    ``config.max_trials`` (then ``design_epsilon`` says what the trials run can detect). Checks of
    positions reached with probability below ``evidence.design_reach`` (the case's TV distance) still run but do not set the cap.
    """
    started = time.perf_counter()
    validate_laws(experiment)
    seed = derive_seed(config.seed, case.id, config.attempt)
    generator = torch.Generator(device=config.device).manual_seed(seed)
    epsilon = config.epsilon_for(case)
    threshold = rejection_threshold(config.alpha, tests_in_run)
    cap = trial_cap(experiment, config, epsilon, threshold)
    watched = config.early_pass and experiment.fixed_trials is None
    state = CaseEvidence(
        experiment.checks,
        math.log(threshold),
        pass_checks=frozenset(c.name for c in designed_checks(experiment, epsilon)) if watched else frozenset(),
        epsilon=epsilon,
        pass_log_threshold=-math.log(config.early_pass_beta) if watched else None,
        planned={} if experiment.fixed_trials is not None else planned_observations(experiment, config, epsilon, threshold),
    )
    # Slow experiments (generate calls) report progress sooner; a watched case looks as often as it may pass.
    batch = max(16, min(config.first_batch, cap // (EARLY_PASS_LOOKS if watched else 8)))
    largest = min(config.max_batch, max(batch, cap // EARLY_PASS_LOOKS)) if watched else config.max_batch
    timed_out = False
    reproducible: bool | None = None
    calls = experiment_max_batch(experiment, config.sampler_max_batch)
    try:
        state.fingerprint, reproducible = probe(case, experiment, probe_trials(experiment, config.first_batch), config.device, calls)
        planned = cap
        with seeded_globals(global_seed(seed, "trials"), config.device):  # a sampler's own np.random / torch draws
            while not state.done() and not passed_early(experiment, state):
                if state.trials >= cap == planned:  # once, at the planned cap
                    cap += top_up(experiment, state, config, epsilon=epsilon, threshold=threshold, cap=planned)
                if state.trials >= cap:
                    break
                n = min(batch, cap - state.trials)
                state.add(draw(experiment, n, generator, calls), n)
                if progress is not None:
                    best = max(state.max_log_e.values(), default=0.0)
                    progress(Progress(case.id, index, total, state.trials, cap, best, state.log_threshold))
                if config.time_budget_s is not None and time.perf_counter() - started > config.time_budget_s:
                    timed_out = state.trials < cap and not state.done()
                    break
                batch = min(2 * batch, largest)
    except TargetRaised as raised:  # the code under test raised on a valid input: a finding, not an error
        state.raised = raised
    result = case_result(
        case,
        experiment,
        state,
        beta=config.beta,
        attempt=config.attempt,
        device=device_name(config.device),
        cap=cap,
        threshold=threshold,
        seed=seed,
        epsilon=epsilon,
        timed_out=timed_out,
        started=started,
    )
    return replace(result, reproducible=reproducible)


def error_result(case: Case, config: SuiteConfig, tests_in_run: int, exc: BaseException, duration: float) -> CaseResult:
    tail = "".join(traceback.format_exception(exc))[-2000:]
    return _empty_result(
        case, config, tests_in_run, verdict=Verdict.ERROR, reason=f"{type(exc).__name__}: {exc}\n{tail}", duration=duration
    )


def skipped_result(case: Case, config: SuiteConfig, tests_in_run: int, reason: str) -> CaseResult:
    return _empty_result(case, config, tests_in_run, verdict=Verdict.SKIPPED, reason=reason, duration=0.0)


def _empty_result(case: Case, config: SuiteConfig, tests_in_run: int, *, verdict: Verdict, reason: str, duration: float) -> CaseResult:
    return CaseResult(
        case_id=case.id,
        family=case.family,
        description=case.description,
        verdict=verdict,
        reason=reason,
        lossless=verdict,
        conformance=verdict,
        n_trials=0,
        trial_cap=0,
        powered=False,
        e_value=1.0,
        log_e_value=0.0,
        p_value=None,
        threshold=rejection_threshold(config.alpha, tests_in_run),
        tv_estimate=None,
        tv_ci=None,
        acceptance=Acceptance(observed=None, expected=None),
        counts_digest="",
        fingerprint="",
        duration_s=round(duration, 4),
        seed=derive_seed(config.seed, case.id, config.attempt),
        attempt=config.attempt,
        device=device_name(config.device),
    )


class CasePool(Protocol):
    """Runs cases by id in other processes; yields (index, result) as each finishes."""

    def run(self, items: Sequence[tuple[int, Case]], config: SuiteConfig, tests: int) -> Iterator[tuple[int, CaseResult]]: ...

    def cancel(self) -> None: ...


def _run_pooled(
    pool: CasePool,
    cases: Sequence[Case],
    built: Sequence[Experiment | BaseException | None],
    config: SuiteConfig,
    tests: int,
    *,
    on_result: Callable[[CaseResult], None] | None,
) -> list[CaseResult]:
    done: dict[int, CaseResult] = {}
    runnable: list[tuple[int, Case]] = []
    for index, (case, experiment) in enumerate(zip(cases, built, strict=True)):
        if experiment is None:
            done[index] = skipped_result(case, config, tests, case.skip_reason or "skipped")
        elif isinstance(experiment, BaseException):
            done[index] = error_result(case, config, tests, experiment, 0.0)
        else:
            runnable.append((index, case))
    for result in done.values():
        if on_result is not None:
            on_result(result)
    for index, result in pool.run(runnable, config, tests):
        done[index] = result
        if on_result is not None:
            on_result(result)
        if config.fail_fast and result.verdict == Verdict.FAIL:
            pool.cancel()
            break
    return [done[i] for i in sorted(done)]


def run_suite(
    cases: Sequence[Case],
    sampler: Sampler,
    config: SuiteConfig,
    *,
    target: str = "reference",
    library: LibraryIdentity | None = None,
    progress: ProgressCallback | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
    pool: CasePool | None = None,
    tests: int | None = None,
) -> RunResult:
    """Run ``cases`` against ``sampler``; alpha is split over every check of every case (Bonferroni), or over
    ``tests`` checks when given (a rerun of some cases of a larger run, with that run's thresholds).

    With a ``pool`` the runnable cases execute in other processes (results arrive as they finish;
    per-batch progress is not forwarded); the run result lists cases in catalogue order.
    """
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.perf_counter()
    device = torch.device(config.device)
    built: list[Experiment | BaseException | None] = []
    for case in cases:
        if case.skip_reason is not None:
            built.append(None)
            continue
        try:
            built.append(case.build(sampler, device))
        except Exception as exc:  # noqa: BLE001 - a target that cannot set a case up is that case's error
            built.append(exc)
    tests = tests or max(1, sum(len(e.checks) for e in built if e is not None and not isinstance(e, BaseException)))
    results: list[CaseResult] = []
    if pool is not None:
        results = _run_pooled(pool, cases, built, config, tests, on_result=on_result)
    for index, (case, experiment) in enumerate(zip(cases, built, strict=True)):
        if pool is not None:
            break
        case_started = time.perf_counter()
        if experiment is None:
            result = skipped_result(case, config, tests, case.skip_reason or "skipped")
        elif isinstance(experiment, BaseException):
            result = error_result(case, config, tests, experiment, 0.0)
        else:
            try:
                result = run_case(case, experiment, config, tests, index=index, total=len(cases), progress=progress)
            except Exception as exc:  # noqa: BLE001 - a crashing target is recorded as an error result
                result = error_result(case, config, tests, exc, time.perf_counter() - case_started)
        results.append(result)
        if on_result is not None:
            on_result(result)
        if config.fail_fast and result.verdict == Verdict.FAIL:
            break
    frozen = tuple(results)
    return RunResult(
        suite_version=SUITE_VERSION,
        catalogue_version=CATALOGUE_VERSION,
        target=target,
        verdict=run_verdict(frozen),
        alpha=config.alpha,
        beta=config.beta,
        tests=tests,
        seed=config.seed,
        device=device_name(config.device),
        environment={**environment(), **(library.to_environment() if library else {})},
        started_at=started_at,
        duration_s=round(time.perf_counter() - started, 3),
        results=frozen,
        early_pass_beta=config.early_pass_beta if config.early_pass else None,
    )
