"""Runs cases: batches of trials until a check rejects or the planned cap, then a frozen result."""

from __future__ import annotations

import hashlib
import math
import platform
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import numpy as np
import scipy
import torch

from workers.suite import CATALOGUE_VERSION, SUITE_VERSION
from workers.suite.cases import Case
from workers.suite.experiments import CheckSpec, Coverage, CoverageDesign, Experiment, Layer, Observation, Violation
from workers.suite.laws import validate_law
from workers.suite.results import (
    Acceptance,
    CaseResult,
    CheckResult,
    Failure,
    RunResult,
    Verdict,
    capped_e,
    finite_or_none,
    run_verdict,
)
from workers.suite.sampling import Sampler, TargetRaised
from workers.suite.stats import (
    SEQUENTIAL_INFLATION,
    detectable_epsilon,
    log_e_dirichlet_mixture,
    plan_test,
    rejection_threshold,
    support_violations,
    trials_for_observations,
    tv_interval,
    weighted_chi2_pvalue,
)

#: Every case is tested at this TV distance under ``--quick``.
QUICK_EPSILON = 0.1
#: Checks of positions reached less often than this run but do not set the trial cap.
MIN_DESIGN_REACH = 1e-3
#: The cap gives every designed check its planned observations except with this probability (binomial).
SHORTFALL_PROBABILITY = 1e-3


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
    time_budget_s: float | None = None
    fail_fast: bool = False

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


def derive_seed(run_seed: int, case_id: str, attempt: int) -> int:
    """A 63-bit seed from (run seed, case, attempt): every result is reproducible from its record."""
    digest = hashlib.blake2b(f"{run_seed}:{case_id}:{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)


FINGERPRINT_SEED = 0


#: Probe trials of an experiment that does not say how many it wants.
DEFAULT_PROBE_TRIALS = 64


def probe_trials(experiment: Experiment, first_batch: int) -> int:
    """Trials of the fingerprint probe: what the experiment asks for (``probe_trials``: many for cheap
    vectorised chain steps, few for ``generate()`` calls), at most one first batch. It depends on the case
    alone, never on the run's other cases, so equal behaviour gives equal fingerprints."""
    wanted = getattr(experiment, "probe_trials", DEFAULT_PROBE_TRIALS)
    return max(1, min(first_batch, int(wanted)))


def output_fingerprint(case: Case, experiment: Experiment, trials: int, device: str) -> str:
    """A hash of the outputs of ``trials`` trials drawn with a seed fixed per case (not per run or commit).

    Two commits whose sampler behaves the same on the case get the same fingerprint, on the same device
    and library versions, so an unchanged fingerprint marks "behaviour unchanged" at no statistical cost.
    The probe's trials are not evidence: the test draws its own with the run's seed.
    """
    generator = torch.Generator(device=device).manual_seed(derive_seed(FINGERPRINT_SEED, case.id, 0))
    obs = experiment.run(trials, generator)
    digest = hashlib.sha256(f"{trials}:".encode())
    digest.update(obs.sample)
    for name in sorted(obs.counts):
        digest.update(name.encode())
        digest.update(np.asarray(obs.counts[name], dtype=np.int64).tobytes())
    for violation in obs.violations:
        digest.update(f"{violation.layer.value}:{violation.message}".encode())
    return digest.hexdigest()[:16]


def device_name(device: str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(dev)}"
    return f"cpu:{platform.machine()}"


def environment() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "platform": platform.platform(),
    }


@dataclass
class _CaseState:
    checks: Sequence[CheckSpec]
    log_threshold: float
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    log_e: dict[str, float] = field(default_factory=dict)
    max_log_e: dict[str, float] = field(default_factory=dict)
    rejected_at: dict[str, int] = field(default_factory=dict)
    violations: dict[Layer, Violation] = field(default_factory=dict)
    malformed: bool = False
    raised: TargetRaised | None = None
    trials: int = 0
    accepted_total: int = 0
    fingerprint: str = ""
    coverage: Coverage | None = None

    def __post_init__(self) -> None:
        self.counts = {c.name: np.zeros(len(c.null), dtype=np.int64) for c in self.checks}
        self.log_e = {c.name: 0.0 for c in self.checks}
        self.max_log_e = dict(self.log_e)

    def add(self, obs: Observation, n: int) -> None:
        """Fold one batch in. A rejection is sticky: crossing the threshold once is a valid rejection."""
        self.trials += n
        self.accepted_total += obs.accepted_total
        if obs.coverage is not None:
            self.coverage = obs.coverage if self.coverage is None else self.coverage.merge(obs.coverage)
        for violation in obs.violations:
            self.violations.setdefault(violation.layer, violation)
        if obs.violations and not obs.counts:
            self.malformed = True
            return
        for check in self.checks:
            if check.name not in obs.counts:
                continue
            counts = self.counts[check.name]
            counts += obs.counts[check.name]
            bad = support_violations(counts, check.null)
            if bad:
                cell = int(np.flatnonzero((counts > 0) & (check.null <= 0))[0])
                message = f"{check.name}: {bad} observation(s) in cells of null probability 0 (first: cell {cell})"
                self.violations.setdefault(check.layer, Violation(check.layer, message))
                self.log_e[check.name] = math.inf
            else:
                self.log_e[check.name] = log_e_dirichlet_mixture(counts, check.null)
            self.max_log_e[check.name] = max(self.max_log_e[check.name], self.log_e[check.name])
            if self.max_log_e[check.name] >= self.log_threshold:
                self.rejected_at.setdefault(check.name, self.trials)

    def failed(self, layer: Layer) -> bool:
        return layer in self.violations or any(c.layer == layer and c.name in self.rejected_at for c in self.checks)

    def done(self) -> bool:
        """A lossless failure ends the case; a conformance failure alone keeps testing losslessness."""
        return self.malformed or self.raised is not None or self.failed(Layer.LOSSLESS)


def designed_checks(experiment: Experiment) -> list[CheckSpec]:
    """The checks that size the run and count for ``powered``: designed, reached with probability >= 1e-3."""
    return [c for c in experiment.checks if c.designed and c.reach >= MIN_DESIGN_REACH]


def trial_cap(experiment: Experiment, config: SuiteConfig, epsilon: float, threshold: float) -> int:
    """Trials that give every designed check its planned observations (power 1 - beta at TV ``epsilon`` at
    level 1 / ``threshold``) except with probability ``SHORTFALL_PROBABILITY``, within ``config.max_trials``."""
    if experiment.fixed_trials is not None:
        return experiment.fixed_trials
    wanted = 0.0
    for check in designed_checks(experiment):
        design = plan_test(check.support, check.reach, epsilon, 1.0 / threshold, config.beta)
        wanted = max(wanted, trials_for_observations(design.needed, check.reach, SHORTFALL_PROBABILITY, limit=config.max_trials))
    # At least one first batch of trials, or what the experiment says is its least (``min_trials``: a few hundred
    # for generate() calls whose checks see many observations per trial).
    floor = min(config.first_batch, int(getattr(experiment, "min_trials", config.first_batch)))
    return int(min(config.max_trials, max(math.ceil(wanted), floor)))


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
    """Sequentially test one case until a lossless check rejects, a certain violation, or the cap.

    Each check's e-process is compared with m / alpha (m = ``tests_in_run``) after every batch;
    monitoring at batch ends keeps Ville's guarantee, so the run's family-wise false-alarm rate is at
    most alpha. The cap gives every check power 1 - beta at the case's TV distance, unless it exceeds
    ``config.max_trials`` (then ``design_epsilon`` says what the trials run can detect). Checks of
    positions reached with probability below ``MIN_DESIGN_REACH`` still run but do not set the cap.
    """
    started = time.perf_counter()
    validate_laws(experiment)
    seed = derive_seed(config.seed, case.id, config.attempt)
    generator = torch.Generator(device=config.device).manual_seed(seed)
    epsilon = config.epsilon_for(case)
    threshold = rejection_threshold(config.alpha, tests_in_run)
    cap = trial_cap(experiment, config, epsilon, threshold)
    state = _CaseState(experiment.checks, math.log(threshold))
    batch = max(16, min(config.first_batch, cap // 8))  # slow experiments (generate calls) report progress sooner
    timed_out = False
    try:
        state.fingerprint = output_fingerprint(case, experiment, probe_trials(experiment, config.first_batch), config.device)
        while state.trials < cap and not state.done():
            n = min(batch, cap - state.trials)
            state.add(experiment.run(n, generator), n)
            if progress is not None:
                best = max(state.max_log_e.values(), default=0.0)
                progress(Progress(case.id, index, total, state.trials, cap, best, state.log_threshold))
            if config.time_budget_s is not None and time.perf_counter() - started > config.time_budget_s:
                timed_out = state.trials < cap and not state.done()
                break
            batch = min(2 * batch, config.max_batch)
    except TargetRaised as raised:  # the code under test raised on a valid input: a finding, not an error
        state.raised = raised
    return _case_result(
        case, experiment, config, state, cap=cap, threshold=threshold, seed=seed, epsilon=epsilon, timed_out=timed_out, started=started
    )


def _case_result(
    case: Case,
    experiment: Experiment,
    config: SuiteConfig,
    state: _CaseState,
    *,
    cap: int,
    threshold: float,
    seed: int,
    epsilon: float,
    timed_out: bool,
    started: float,
) -> CaseResult:
    alpha_test = 1.0 / threshold  # alpha / m
    designed = {c.name for c in designed_checks(experiment)}
    checks: list[CheckResult] = []
    for check in experiment.checks:
        counts = state.counts[check.name]
        observations = int(counts.sum())
        tv_hat, lo, hi = tv_interval(counts, check.null)
        # What this check can detect from the observations it actually got (not trials x the null's reach:
        # a sampler that reaches the position less often gives it fewer).
        design_eps = detectable_epsilon(check.support, observations / SEQUENTIAL_INFLATION, alpha_test, config.beta)
        checks.append(
            CheckResult(
                name=check.name,
                layer=check.layer.value,
                observations=observations,
                log_e_value=finite_or_none(state.max_log_e[check.name]),
                e_value=capped_e(state.max_log_e[check.name]),
                rejected=check.name in state.rejected_at,
                support_violations=support_violations(counts, check.null),
                tv_estimate=tv_hat,
                tv_ci=(lo, hi),
                design_epsilon=finite_or_none(design_eps),
                stopped_log_e_value=finite_or_none(state.log_e[check.name]),
                stopped_e_value=capped_e(state.log_e[check.name]),
                reach=check.reach,
                designed=check.name in designed,
            )
        )
    lossless = Verdict.FAIL if state.failed(Layer.LOSSLESS) else Verdict.PASS
    conformance = Verdict.FAIL if state.failed(Layer.CONFORMANCE) else Verdict.PASS
    failure: Failure | None = None
    if lossless == Verdict.FAIL:
        failure = Failure.LOSSLESS
    elif state.raised is not None:
        failure = Failure.RAISED
        lossless = conformance = Verdict.ERROR  # not measured to the end: the target stopped answering
    elif conformance == Verdict.FAIL:
        failure = Failure.CONFORMANCE
    verdict = Verdict.PASS if failure is None else Verdict.FAIL
    failed_layer = {Failure.LOSSLESS: Layer.LOSSLESS, Failure.CONFORMANCE: Layer.CONFORMANCE}.get(failure) if failure else None
    headline = _headline(checks, state, failed_layer, designed)
    # A certain violation in the failed layer refutes the law outright (infinite evidence, log E None), even
    # when no check counted it (deterministic experiments, malformed output).
    certain = failed_layer is not None and failed_layer in state.violations
    # Power backs a pass: every designed check of each layer that passed got the observations its design
    # needs (a failure needs none). A conformance-only failure still claims losslessness, so its lossless
    # checks must be powered.
    claimed = {c.layer for c in checks if c.name in designed}
    if failure in (Failure.LOSSLESS, Failure.RAISED):
        claimed = set()
    elif failure == Failure.CONFORMANCE:
        claimed = {Layer.LOSSLESS.value}
    backing = [c for c in checks if c.name in designed and c.layer in claimed]
    powered = not (timed_out and failure is None) and all(
        c.design_epsilon is not None and c.design_epsilon <= epsilon * (1 + 1e-9) for c in backing
    )
    reason = _reason(state, checks, threshold=threshold, epsilon=epsilon, powered=powered, designed=designed, claimed=claimed)
    # A speculative case that did not exercise what it was built for (drafts per verification, partial and
    # full acceptance, rounds per call) is not a pass at its design: it says so and counts as underpowered.
    coverage_design: CoverageDesign | None = getattr(experiment, "coverage_design", None)
    coverage = None
    if coverage_design is not None:
        observed = state.coverage or Coverage()
        coverage = observed.to_dict(coverage_design)
        if coverage["shortfalls"] and verdict == Verdict.PASS and state.trials > 0:
            powered = False
            reason = f"coverage short of design: {'; '.join(coverage['shortfalls'])}; {reason}"
    p_value = None
    if headline is not None and state.trials > 0:
        spec = next(c for c in experiment.checks if c.name == headline.name)
        draws = int(min(999, max(99, 5_000_000 // max(len(spec.null), 1))))  # bounded cost at large V
        p_value = weighted_chi2_pvalue(state.counts[spec.name], spec.null, np.random.default_rng(seed), draws=draws)
    digest = hashlib.sha256()
    for name in sorted(state.counts):
        digest.update(name.encode())
        digest.update(state.counts[name].tobytes())
    return CaseResult(
        case_id=case.id,
        family=case.family,
        description=case.description,
        verdict=verdict,
        reason=reason,
        lossless=lossless,
        conformance=conformance,
        n_trials=state.trials,
        trial_cap=cap,
        powered=powered,
        e_value=capped_e(math.inf) if certain else (headline.e_value if headline else 1.0),
        log_e_value=None if certain else (headline.log_e_value if headline else 0.0),
        p_value=p_value,
        threshold=threshold,
        tv_estimate=headline.tv_estimate if headline else None,
        tv_ci=headline.tv_ci if headline else None,
        acceptance=Acceptance(
            observed=state.accepted_total / state.trials if state.trials else None,
            expected=experiment.expected_acceptance,
        ),
        counts_digest=digest.hexdigest()[:16],
        fingerprint=state.fingerprint,
        duration_s=round(time.perf_counter() - started, 4),
        seed=seed,
        attempt=config.attempt,
        device=device_name(config.device),
        checks=tuple(checks),
        failure=failure,
        headline=headline.name if headline else None,
        current_log_e_value=None if certain else (headline.stopped_log_e_value if headline else 0.0),
        current_e_value=capped_e(math.inf) if certain else (headline.stopped_e_value if headline else 1.0),
        certain=tuple(layer.value for layer in (Layer.LOSSLESS, Layer.CONFORMANCE) if layer in state.violations),
        coverage=coverage,
    )


def _headline(checks: Sequence[CheckResult], state: _CaseState, failed: Layer | None, designed: set[str]) -> CheckResult | None:
    """The check a case reports.

    Failed layer: the check that rejected first (the strongest evidence when none did: certain violations).
    Otherwise the designed checks (reached with probability >= 1e-3): the one with the largest upper TV
    bound, i.e. the least the case can say. Taking the largest running maximum over all checks instead
    would headline a rarely reached check that wandered up (its running maximum is not an e-value).
    """
    if failed is not None:
        pool = [c for c in checks if c.layer == failed.value]
        rejected = [c for c in pool if c.name in state.rejected_at]
        if rejected:
            return min(rejected, key=lambda c: (state.rejected_at[c.name], -(math.inf if c.log_e_value is None else c.log_e_value)))
        return max(pool, key=lambda c: math.inf if c.log_e_value is None else c.log_e_value, default=None)
    pool = [c for c in checks if c.name in designed] or list(checks)
    return max(pool, key=lambda c: (c.tv_ci[1], c.tv_estimate), default=None)


def _reason(
    state: _CaseState,
    checks: Sequence[CheckResult],
    *,
    threshold: float,
    epsilon: float,
    powered: bool,
    designed: set[str],
    claimed: set[str],
) -> str:
    if state.raised is not None and not state.failed(Layer.LOSSLESS):
        error = state.raised.error
        tail = "".join(traceback.format_exception(error))[-2000:]
        return f"the target raised on a valid input after {state.trials} trials: {state.raised}\n{tail}"
    for layer in (Layer.LOSSLESS, Layer.CONFORMANCE):
        if layer in state.violations:
            reason = f"certain {layer.value} violation: {state.violations[layer].message}"
            return reason + _underpowered_lossless(layer, checks, epsilon=epsilon, powered=powered, designed=designed, claimed=claimed)
        rejected = [c for c in checks if c.layer == layer.value and c.rejected]
        if rejected:
            first = min(rejected, key=lambda c: state.rejected_at[c.name])
            reason = (
                f"{layer.value}: {first.name} e-value reached the threshold {threshold:.3g} after "
                f"{state.rejected_at[first.name]} trials (TV estimate {first.tv_estimate:.3f})"
            )
            return reason + _underpowered_lossless(layer, checks, epsilon=epsilon, powered=powered, designed=designed, claimed=claimed)
    if not checks:
        return f"every deterministic check held in {state.trials} trials"
    if not powered:
        worst = max((c.design_epsilon or math.inf for c in checks if c.name in designed and c.layer in claimed), default=math.inf)
        return (
            f"no check reached the threshold in {state.trials} trials; underpowered: the observations the checks got "
            f"detect TV >= {worst:.3g} at the designed power, not {epsilon:g}"
        )
    return f"no check reached the threshold in {state.trials} trials (designed to detect TV >= {epsilon:g})"


def _underpowered_lossless(
    layer: Layer, checks: Sequence[CheckResult], *, epsilon: float, powered: bool, designed: set[str], claimed: set[str]
) -> str:
    """A conformance failure still claims losslessness: say so when that claim is not backed by power."""
    if layer is not Layer.CONFORMANCE or powered:
        return ""
    worst = max((c.design_epsilon or math.inf for c in checks if c.name in designed and c.layer in claimed), default=math.inf)
    return f"; losslessness underpowered: its observations detect TV >= {worst:.3g}, not {epsilon:g}"


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
    library: dict[str, str] | None = None,
    progress: ProgressCallback | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
    pool: CasePool | None = None,
) -> RunResult:
    """Run ``cases`` against ``sampler``; alpha is split over every check of every case (Bonferroni).

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
    tests = max(1, sum(len(e.checks) for e in built if e is not None and not isinstance(e, BaseException)))
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
        environment={**environment(), **({f"library_{k}": v for k, v in library.items()} if library else {})},
        started_at=started_at,
        duration_s=round(time.perf_counter() - started, 3),
        results=frozen,
    )
