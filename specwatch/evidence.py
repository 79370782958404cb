"""A case's evidence: batches of trials folded into one e-process per check, then judged into a frozen result.

:class:`CaseEvidence` keeps the counts and e-values as batches arrive (a rejection is sticky); :func:`case_result`
turns them into a :class:`~specwatch.protocol.CaseResult`: the verdict per layer, the headline check, whether
a pass is powered, and the reason in words. The runner (:mod:`specwatch.runner`) decides when to stop.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specwatch.cases import Case
from specwatch.early_pass import holds_evidence, log_pass_statistic, may_stop_early
from specwatch.experiments import CheckSpec, Coverage, CoverageDesign, Experiment, Observation, Violation
from specwatch.protocol import Acceptance, CaseResult, CheckResult, Failure, Layer, Stop, Verdict, capped_e, finite_or_none
from specwatch.reasons import case_reason, early_reason, headline, pass_scope
from specwatch.sampling import TargetRaised
from specwatch.stats import (
    design_epsilon,
    log_e_dirichlet_mixture,
    support_violations,
    tv_interval,
    weighted_chi2_pvalue,
)

#: Checks of positions reached less often than this (or than the case's TV distance, :func:`design_reach`) run but
#: do not set the trial cap.
MIN_DESIGN_REACH = 1e-3


@dataclass
class CaseEvidence:
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
    expected_accepted: float | None = None
    #: The early pass (docs/statistics.md §7a): the checks it watches (the designed ones), the TV distance they
    #: are designed at and ln(1 / beta_pass); None: no early pass. A check passes once its statistic reaches the
    #: threshold at a batch end (sticky, like a rejection); its statistic is kept until then.
    pass_checks: frozenset[str] = frozenset()
    epsilon: float = 0.0
    pass_log_threshold: float | None = None
    pass_log: dict[str, float] = field(default_factory=dict)
    passed_at: dict[str, int] = field(default_factory=dict)
    #: The observations each designed check's design plans (``stats.plan_test``), and the trials at the first batch end
    #: where it had them. A watched check that has them is done: its miss at TV >= epsilon is then bounded by beta (the
    #: fixed-n design of docs/statistics.md §7), so the case need not wait for its pass statistic.
    planned: dict[str, int] = field(default_factory=dict)
    planned_at: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.counts = {c.name: np.zeros(len(c.null), dtype=np.int64) for c in self.checks}
        self.log_e = {c.name: 0.0 for c in self.checks}
        self.max_log_e = dict(self.log_e)
        if self.pass_log_threshold is not None:
            self.pass_log = {c.name: 0.0 for c in self.checks if c.name in self.pass_checks}

    def add(self, obs: Observation, n: int) -> None:
        """Fold one batch in. A rejection is sticky: crossing the threshold once is a valid rejection."""
        self.trials += n
        self.accepted_total += obs.accepted_total
        if obs.expected_accepted is not None:
            self.expected_accepted = (self.expected_accepted or 0.0) + obs.expected_accepted
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
            self._update_pass(check)
            if check.name in self.planned and check.name not in self.planned_at and counts.sum() >= self.planned[check.name]:
                self.planned_at[check.name] = self.trials

    def _update_pass(self, check: CheckSpec) -> None:
        """The pass statistic of a watched check not yet done (once it has passed or has its planned observations, the
        statistic no longer decides anything and is not refined further)."""
        done = check.name in self.passed_at or check.name in self.planned_at
        if check.name not in self.pass_log or done or self.pass_log_threshold is None:
            return
        statistic = log_pass_statistic(self.counts[check.name], check.null, self.epsilon, target=self.pass_log_threshold)
        self.pass_log[check.name] = statistic
        if self.pass_log[check.name] >= self.pass_log_threshold:
            self.passed_at[check.name] = self.trials

    def passed(self) -> bool:
        """Every watched check is done: it passed early, or has its planned observations, or its layer already failed
        (a failed layer claims nothing); and no check of a layer that has not failed, designed or not, holds evidence
        against its law (its e-process reached the fourth root of the threshold: :func:`~specwatch.early_pass.may_stop_early`)."""
        watched = [c for c in self.checks if c.name in self.pass_log]
        live = [self.max_log_e[c.name] for c in self.checks if not self.failed(c.layer)]
        return may_stop_early((self.check_done(c) for c in watched), live, self.log_threshold)

    def check_done(self, check: CheckSpec) -> bool:
        """The check passed early, has its planned observations (at a batch end, sticky) or its layer failed."""
        return check.name in self.passed_at or check.name in self.planned_at or self.failed(check.layer)

    def holding(self) -> list[str]:
        """The checks of layers that have not failed whose e-process reached the fourth root of the threshold: while
        any does, the case does not pass early (docs/statistics.md §7a, "Held by evidence")."""
        return [c.name for c in self.checks if not self.failed(c.layer) and holds_evidence(self.max_log_e[c.name], self.log_threshold)]

    def failed(self, layer: Layer) -> bool:
        return layer in self.violations or any(c.layer == layer and c.name in self.rejected_at for c in self.checks)

    def done(self) -> bool:
        """A lossless failure ends the case; a conformance failure alone keeps testing losslessness."""
        return self.malformed or self.raised is not None or self.failed(Layer.LOSSLESS)


def design_reach(epsilon: float) -> float:
    """The least reach of a check that sizes a case designed at TV ``epsilon``: ``epsilon`` itself (at least
    :data:`MIN_DESIGN_REACH`). A sampler that is exact everywhere except at a position reached with probability
    r < epsilon emits a record within TV r of the exact one, whatever it does there (docs/statistics.md §7, "Reach"):
    such a position cannot carry a TV-epsilon change of the case on its own, and sizing the run on it would multiply
    the trials by 1 / r. It is still checked at the run's level for as long as the case runs."""
    return max(MIN_DESIGN_REACH, epsilon)


def designed_checks(experiment: Experiment, epsilon: float) -> list[CheckSpec]:
    """The checks that size a case designed at TV ``epsilon`` and count for ``powered``: designed, reached with
    probability at least :func:`design_reach`."""
    least = design_reach(epsilon)
    return [c for c in experiment.checks if c.designed and c.reach >= least]


def passed_early(experiment: Experiment, state: CaseEvidence) -> bool:
    """Every designed check is done (passed early, or has its planned observations; :meth:`CaseEvidence.passed`) and a
    speculative case exercised what it was built for (a case short of its coverage design runs on: stopping would turn
    its pass into an underpowered one)."""
    if not state.passed():
        return False
    design: CoverageDesign | None = getattr(experiment, "coverage_design", None)
    return design is None or not (state.coverage or Coverage()).to_dict(design)["shortfalls"]


def check_results(experiment: Experiment, state: CaseEvidence, *, beta: float, threshold: float, designed: set[str]) -> list[CheckResult]:
    """Each check's result from its evidence: observations, e-values, TV interval and what it can detect."""
    alpha_test = 1.0 / threshold  # alpha / m
    checks: list[CheckResult] = []
    for check in experiment.checks:
        counts = state.counts[check.name]
        observations = int(counts.sum())
        tv_hat, lo, hi = tv_interval(counts, check.null)
        # What this check can detect from the observations it actually got (not trials x the null's reach:
        # a sampler that reaches the position less often gives it fewer).
        design_eps = design_epsilon(check.support, observations, alpha_test, beta)
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
                pass_log_statistic=finite_or_none(state.pass_log[check.name]) if check.name in state.pass_log else None,
                passed_at=state.passed_at.get(check.name),
                planned_observations=state.planned.get(check.name),
                planned_at=state.planned_at.get(check.name),
            )
        )
    return checks


@dataclass(frozen=True)
class _Outcome:
    """A case's verdict per layer and overall, and what failed (None: it passed)."""

    lossless: Verdict
    conformance: Verdict
    failure: Failure | None

    @property
    def verdict(self) -> Verdict:
        return Verdict.PASS if self.failure is None else Verdict.FAIL

    @property
    def failed_layer(self) -> Layer | None:
        return {Failure.LOSSLESS: Layer.LOSSLESS, Failure.CONFORMANCE: Layer.CONFORMANCE}.get(self.failure) if self.failure else None


def _outcome(state: CaseEvidence) -> _Outcome:
    lossless = Verdict.FAIL if state.failed(Layer.LOSSLESS) else Verdict.PASS
    conformance = Verdict.FAIL if state.failed(Layer.CONFORMANCE) else Verdict.PASS
    if lossless == Verdict.FAIL:
        return _Outcome(lossless, conformance, Failure.LOSSLESS)
    if state.raised is not None:  # not measured to the end: the target stopped answering
        return _Outcome(Verdict.ERROR, Verdict.ERROR, Failure.RAISED)
    return _Outcome(lossless, conformance, Failure.CONFORMANCE if conformance == Verdict.FAIL else None)


def _claimed(checks: Sequence[CheckResult], failure: Failure | None, designed: set[str]) -> set[str]:
    """The layers a case's verdict claims, whose designed checks must be powered: every designed layer of a pass, the
    lossless layer of a conformance-only failure (it still claims losslessness), none of another failure."""
    if failure in (Failure.LOSSLESS, Failure.RAISED):
        return set()
    if failure == Failure.CONFORMANCE:
        return {Layer.LOSSLESS.value}
    return {c.layer for c in checks if c.name in designed}


def _coverage(experiment: Experiment, state: CaseEvidence, verdict: Verdict) -> tuple[dict[str, Any] | None, str | None]:
    """The case's coverage against its design, and the shortfall that makes a pass underpowered (None: none). A
    speculative case that did not exercise what it was built for (drafts per verification, partial and full acceptance,
    rounds per call) is not a pass at its design."""
    coverage_design: CoverageDesign | None = getattr(experiment, "coverage_design", None)
    if coverage_design is None:
        return None, None
    coverage = (state.coverage or Coverage()).to_dict(coverage_design)
    if coverage["shortfalls"] and verdict == Verdict.PASS and state.trials > 0:
        return coverage, f"coverage short of design: {'; '.join(coverage['shortfalls'])}"
    return coverage, None


def _p_value(experiment: Experiment, state: CaseEvidence, headline: CheckResult | None, seed: int) -> float | None:
    """The headline check's weighted chi-square p-value (a description of the data, not the decision)."""
    if headline is None or state.trials == 0:
        return None
    spec = next(c for c in experiment.checks if c.name == headline.name)
    draws = int(min(999, max(99, 5_000_000 // max(len(spec.null), 1))))  # bounded cost at large V
    return weighted_chi2_pvalue(state.counts[spec.name], spec.null, np.random.default_rng(seed), draws=draws)


def _acceptance(experiment: Experiment, state: CaseEvidence) -> Acceptance:
    """Accepted drafts per trial, observed and expected (the experiment's own expectation, or the one it measured)."""
    expected = experiment.expected_acceptance
    if state.expected_accepted is not None:
        expected = state.expected_accepted / state.trials if state.trials else None
    observed = state.accepted_total / state.trials if state.trials else None
    return Acceptance(observed=observed, expected=expected, per_trial_max=experiment.accepted_per_trial_max)


def _counts_digest(state: CaseEvidence) -> str:
    digest = hashlib.sha256()
    for name in sorted(state.counts):
        digest.update(name.encode())
        digest.update(state.counts[name].tobytes())
    return digest.hexdigest()[:16]


def case_result(
    case: Case,
    experiment: Experiment,
    state: CaseEvidence,
    *,
    beta: float,
    attempt: int,
    device: str,
    cap: int,
    threshold: float,
    seed: int,
    epsilon: float,
    timed_out: bool,
    started: float,
) -> CaseResult:
    """The frozen result of a case from its evidence (``device``: the device's name, as recorded)."""
    designed = {c.name for c in designed_checks(experiment, epsilon)}
    checks = check_results(experiment, state, beta=beta, threshold=threshold, designed=designed)
    outcome = _outcome(state)
    failure, verdict = outcome.failure, outcome.verdict
    top = headline(checks, state, outcome.failed_layer, designed)
    # A certain violation in the failed layer refutes the law outright (infinite evidence, log E None), even
    # when no check counted it (deterministic experiments, malformed output).
    certain = outcome.failed_layer is not None and outcome.failed_layer in state.violations
    # Power backs a pass: every designed check of each claimed layer got the observations its design needs, or
    # passed early (backed by its pass statistic, docs/statistics.md §7a); a failure needs none.
    claimed = _claimed(checks, failure, designed)
    backing = [c for c in checks if c.name in designed and c.layer in claimed]
    powered = not (timed_out and failure is None) and all(_backs(c, epsilon) for c in backing)
    early = failure in (None, Failure.CONFORMANCE) and passed_early(experiment, state) and state.trials < cap
    reason = (
        early_reason(state, [c for c in experiment.checks if c.name in state.pass_log], cap, epsilon)
        if early and failure is None
        else case_reason(state, checks, threshold=threshold, epsilon=epsilon, powered=powered, designed=designed, claimed=claimed)
    )
    reason += pass_scope(state, checks, designed, epsilon) if failure is None and state.trials > 0 else ""
    coverage, shortfall = _coverage(experiment, state, verdict)
    if shortfall is not None:
        powered = False
        reason = f"{shortfall}; {reason}"
    # An experiment that drafts but cannot measure acceptance honestly says why, rather than passing silently on it.
    unmeasured: str | None = getattr(experiment, "acceptance_unmeasured", None)
    if unmeasured:
        reason = f"{reason}; acceptance not measured: {unmeasured}"
    return CaseResult(
        case_id=case.id,
        family=case.family,
        description=case.description,
        verdict=verdict,
        reason=reason,
        lossless=outcome.lossless,
        conformance=outcome.conformance,
        n_trials=state.trials,
        trial_cap=cap,
        powered=powered,
        e_value=capped_e(math.inf) if certain else (top.e_value if top else 1.0),
        log_e_value=None if certain else (top.log_e_value if top else 0.0),
        p_value=_p_value(experiment, state, top, seed),
        threshold=threshold,
        tv_estimate=top.tv_estimate if top else None,
        tv_ci=top.tv_ci if top else None,
        acceptance=_acceptance(experiment, state),
        counts_digest=_counts_digest(state),
        fingerprint=state.fingerprint,
        duration_s=round(time.perf_counter() - started, 4),
        seed=seed,
        attempt=attempt,
        device=device,
        checks=tuple(checks),
        failure=failure,
        headline=top.name if top else None,
        current_log_e_value=None if certain else (top.stopped_log_e_value if top else 0.0),
        current_e_value=capped_e(math.inf) if certain else (top.stopped_e_value if top else 1.0),
        certain=tuple(layer.value for layer in (Layer.LOSSLESS, Layer.CONFORMANCE) if layer in state.violations),
        coverage=coverage,
        early_pass=early,
        pass_threshold=None if state.pass_log_threshold is None else math.exp(state.pass_log_threshold),
        stopped_by=_stopped_by(state, early=early, timed_out=timed_out),
    )


def _backs(check: CheckResult, epsilon: float) -> bool:
    """A designed check backs a pass at TV ``epsilon``: it passed early, or its observations detect ``epsilon``."""
    return check.passed_at is not None or (check.design_epsilon is not None and check.design_epsilon <= epsilon * (1 + 1e-9))


def _stopped_by(state: CaseEvidence, *, early: bool, timed_out: bool) -> Stop:
    """Why the case stopped drawing trials: a failure that ends it, every designed check done before the cap, the time
    budget, or the cap (the runner's loop, :func:`specwatch.runner.run_case_once`, in the same order)."""
    if state.done():
        return Stop.FAILED
    if early:
        return Stop.CHECKS_DONE
    return Stop.TIME_BUDGET if timed_out else Stop.CAP
