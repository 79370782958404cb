"""Run analysis in the database: classify a finished run, confirm, bisect, open and resolve alerts.

:func:`analyse` is the domain function behind ``workers.analyse_run``: it locks the run, decides with the
pure functions of :mod:`workers.analysis`, writes what it decided (the run's ``analysis``, alerts, runs to
queue, outbox rows) and flushes; the task commits and then enqueues the new runs. It is idempotent: a run is
analysed once (``analysed_at`` under the run's row lock).

The story of a failing commit:

1. A primary run fails (a case rejects at the run's family-wise level). With ``confirm_failures`` a
   confirmation run of the same commit is queued with fresh seeds (``seed_attempt`` 1: the suite's
   ``--attempt``). A run in status ``error`` is a BROKEN commit at once: deterministic, nothing to confirm.
2. The confirmation run's analysis confirms, per failing case and only within the layer that failed, with
   the same check's stopped e-values multiplied, or that check rejecting again, or a certain violation of
   that layer, or the target raising again (:func:`workers.analysis.confirmation`); the alert kind follows
   the layer confirmed. No case confirmed: no alert (recorded on both runs).
3. Confirmed: the first bad commit is searched between the last good tested commit of the branch and this
   one (:func:`workers.analysis.bisect`), one midpoint run at a time, each a ``bisection`` run whose parent
   is the confirmed run. A commit is bad when one of the confirmed cases fails in its run, good when they
   all pass, unknown (never retested) when its run is an error.
   Failing cases already in an unresolved alert of the branch (same case, same reason) are known and set
   aside first: only new failures are confirmed, bisected and alerted, so a standing failure never hides
   a later regression.
4. The alert is opened once the first bad commit is known: ``INSERT .. ON CONFLICT DO NOTHING`` on
   (target, branch, first bad commit, kind), so two workers naming the same first bad commit make one alert
   (the second merges its cases); the outbox rows are written only by the insert that created it.

A primary run also checks its passing cases' acceptance drift against their recent passing runs on the
branch (Hoeffding, at ``drift_alpha`` per run: already rare, so not confirmed). A drift is bisected like a
failure, between the newest passing commit (good by definition: it is in the baseline) and this one, a
commit being bad when a drifting case drifts from that same baseline there too; the PERFORMANCE alert names
the first bad commit. (When the run also has failing cases, their search owns the run's bisection and the
drift alert names this commit.) A run that is not broken resolves the open alerts of its branch whose cases
all pass again.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.models import (
    RELEASES_BRANCH,
    Alert,
    AlertKind,
    AlertState,
    CaseResult,
    Commit,
    Run,
    RunPurpose,
    RunStatus,
    Target,
    Verdict,
)
from workers.analysis import (
    CONFORMANCE,
    LOSSLESS,
    RAISED,
    AcceptanceSample,
    CaseEvidence,
    CaseOutcome,
    CheckEvidence,
    Kind,
    Outcome,
    acceptance_drift,
    bisect,
    case_gamma,
    classify,
    confirmation,
)
from workers.notify import NotifyConfig, queue_alert_message, queue_commit_status

log = logging.getLogger(__name__)

ANALYSABLE = frozenset({RunStatus.passed, RunStatus.failed, RunStatus.error})


@dataclass(frozen=True)
class AnalysisConfig:
    confirm_failures: bool = True
    drift_baseline_runs: int = 5
    drift_alpha: float = 1e-4
    notify: NotifyConfig = field(default_factory=NotifyConfig)


@dataclass
class AnalysisReport:
    run_id: int
    outcome: str  # skipped | analysed
    reason: str | None = None
    kind: str | None = None
    queued: list[int] = field(default_factory=list)  # runs to enqueue after commit
    opened: list[int] = field(default_factory=list)  # alerts created by this analysis
    merged: list[int] = field(default_factory=list)  # existing alerts that got more cases
    resolved: list[int] = field(default_factory=list)
    notifications: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "outcome": self.outcome,
            "reason": self.reason,
            "kind": self.kind,
            "queued": self.queued,
            "opened": self.opened,
            "merged": self.merged,
            "resolved": self.resolved,
            "notifications": self.notifications,
        }


@dataclass
class _Context:
    """One analysis: its session, configuration, clock and report."""

    session: Session
    config: AnalysisConfig
    now: datetime
    report: AnalysisReport


def _lock_run(session: Session, run_id: int) -> Run | None:
    return session.scalars(select(Run).where(Run.id == run_id).with_for_update()).one_or_none()


def _cases(session: Session, run_id: int) -> dict[str, CaseResult]:
    return {c.case_id: c for c in session.scalars(select(CaseResult).where(CaseResult.run_id == run_id))}


def _raised(case: CaseResult) -> bool:
    return (case.details or {}).get("failure") == "raised"


def _outcomes(cases: dict[str, CaseResult]) -> list[CaseOutcome]:
    return [CaseOutcome(c.case_id, c.verdict.value, c.lossless, c.conformance, raised=_raised(c)) for c in cases.values()]


def alert_branch(commit: Commit) -> str:
    return commit.branch if commit.branch is not None else RELEASES_BRANCH


def _entry(case: CaseResult, reason: str) -> dict[str, Any]:
    if reason == "exception":  # the exception's first line (the case's reason holds its traceback too)
        return {"case_id": case.case_id, "reason": reason, "error": str((case.details or {}).get("reason", "")).split("\n")[0][:500]}
    return {
        "case_id": case.case_id,
        "reason": reason,
        "e_value": case.e_value,
        "log_e_value": case.log_e_value,
        "threshold": case.threshold,
        "tv_estimate": case.tv_estimate,
        "acceptance_observed": case.acceptance_observed,
        "acceptance_expected": case.acceptance_expected,
        "n_trials": case.n_trials,
    }


def analyse(session: Session, run_id: int, *, config: AnalysisConfig, now: datetime) -> AnalysisReport:
    """Analyse finished run ``run_id`` once (see the module docstring); the caller commits, then enqueues."""
    run = _lock_run(session, run_id)
    if run is None:
        return AnalysisReport(run_id, "skipped", "no such run")
    if run.analysed_at is not None:
        return AnalysisReport(run_id, "skipped", "already analysed")
    if run.status not in ANALYSABLE:
        return AnalysisReport(run_id, "skipped", f"run is {run.status.value}")
    report = AnalysisReport(run_id, "analysed")
    cases = _cases(session, run.id)
    kind, failing = classify(run.status.value, _outcomes(cases))
    report.kind = kind.value if kind else None
    analysis: dict[str, Any] = {"kind": report.kind, "failing": failing}
    ctx = _Context(session, config, now, report)
    if run.purpose is RunPurpose.primary:
        _analyse_primary(ctx, run, cases, analysis)
    elif run.purpose is RunPurpose.confirmation:
        _analyse_confirmation(ctx, run, cases, analysis)
    else:
        _continue_bisection_of(ctx, run)
    run.analysis = analysis
    run.analysed_at = now
    session.flush()
    log.info(
        "run_analysed run_id=%s purpose=%s kind=%s queued=%s opened=%s resolved=%s",
        run.id,
        run.purpose.value,
        report.kind,
        report.queued,
        report.opened,
        report.resolved,
    )
    return report


# ------------------------------------------------------------------------------------------ primary runs
def _analyse_primary(ctx: _Context, run: Run, cases: dict[str, CaseResult], analysis: dict[str, Any]) -> None:
    session, config, report = ctx.session, ctx.config, ctx.report
    kind = Kind(analysis["kind"]) if analysis["kind"] else None
    if kind in (Kind.VIOLATION, Kind.PERFORMANCE):
        kind, analysis["failing"], analysis["known_failing"] = _new_failures(session, run, cases)
        analysis["kind"] = kind.value if kind else None
        report.kind = analysis["kind"]
    failing: list[str] = analysis["failing"]
    commit = run.commit
    state = {RunStatus.passed: "success", RunStatus.failed: "failure"}.get(run.status, "error")
    confirming = kind is not None and kind is not Kind.BROKEN and config.confirm_failures
    report.notifications += queue_commit_status(session, config.notify, run, "confirming" if confirming else state)
    analysis["unchanged_cases"] = _unchanged_cases(session, run, cases)
    if kind is Kind.BROKEN:
        entry = {"case_id": "(suite)", "reason": "broken", "error": (run.error or "")[:500]}
        _open_alert(ctx, run, AlertKind.broken, commit, [entry])
    elif kind is not None and config.confirm_failures:
        confirmation = _child_run(session, run, commit, RunPurpose.confirmation, seed_attempt=run.seed_attempt + 1)
        if confirmation is not None:
            report.queued.append(confirmation.id)
        analysis["confirmation_run_id"] = confirmation.id if confirmation else None
    elif kind is not None:
        entries = [_entry(cases[c], _failure_reason(cases[c])) for c in failing]
        _start_bisection(ctx, run, AlertKind(kind.value), entries, confirmation=None, state=analysis)
    drifting = _drift(session, run, cases, config)
    if drifting:
        analysis["drift"] = [e["case_id"] for e in drifting]
        baseline = _newest_before(session, run, RunStatus.passed)
        if kind is None and baseline is not None:
            # Bisected between the newest passing commit (the baseline's newest, good by definition) and
            # this one: a commit is bad when a drifting case drifts from the same baseline there too.
            _start_bisection(ctx, run, AlertKind.performance, drifting, confirmation=None, state=analysis, after=baseline.commit)
        else:  # the failing cases' search owns this run's bisection
            _open_alert(ctx, run, AlertKind.performance, commit, drifting)
    if run.status is not RunStatus.error:
        _resolve_recovered(ctx, run, cases)


def _failure_reason(case: CaseResult) -> str:
    """An alert entry's reason for a failing case: its worst failure (lossless, then the target raising)."""
    if case.lossless is False:
        return LOSSLESS
    return RAISED if _raised(case) else CONFORMANCE


def _known_failures(session: Session, run: Run) -> set[tuple[str, str]]:
    """(case, reason) pairs of the branch's alerts that are not resolved and began at or before this commit."""
    commit = run.commit
    alerts = session.scalars(
        select(Alert)
        .join(Commit, Alert.first_bad_commit_id == Commit.id)
        .where(
            Alert.target_id == commit.target_id,
            Alert.branch == alert_branch(commit),
            Alert.state != AlertState.resolved,
            Alert.kind.in_([AlertKind.violation, AlertKind.performance]),
            Commit.branch_order <= (commit.branch_order or 0),
        )
    )
    return {(entry["case_id"], entry.get("reason", "")) for alert in alerts for entry in alert.cases}


def _new_failures(session: Session, run: Run, cases: dict[str, CaseResult]) -> tuple[Kind | None, list[str], list[str]]:
    """The run's kind and failing cases once the known failures are set aside, and the known ones.

    A case that already fails in an unresolved alert of the branch (for the same reason) is known: it
    keeps failing until that alert resolves, and counting it again would make every later regression's
    bisection land on the old first bad commit (merged quietly into the old alert). New lossless
    failures make a VIOLATION; otherwise new conformance-only failures a PERFORMANCE regression.
    """
    known = _known_failures(session, run)
    failing = sorted((c for c in cases.values() if c.verdict is Verdict.fail), key=lambda c: c.case_id)
    # A known lossless failure covers the same case failing conformance only (a weak bug's lossless check can
    # miss the threshold in one run while its conformance still fails); the reverse is new (worse) news.
    fresh = [c for c in failing if (c.case_id, _failure_reason(c)) not in known and (c.case_id, "lossless") not in known]
    already = [c.case_id for c in failing if c not in fresh]
    lossy = [c.case_id for c in fresh if _failure_reason(c) == LOSSLESS]
    if lossy:
        return Kind.VIOLATION, lossy, already
    raised = [c.case_id for c in fresh if _failure_reason(c) == RAISED]
    if raised:
        return Kind.EXCEPTION, raised, already
    if fresh:
        return Kind.PERFORMANCE, [c.case_id for c in fresh], already
    return None, [], already


def _child_run(session: Session, parent: Run, commit: Commit, purpose: RunPurpose, *, seed_attempt: int = 0) -> Run | None:
    """The confirmation or bisection run of ``parent`` on ``commit``: created unless it exists (None then)."""
    existing = session.scalars(select(Run).where(Run.parent_run_id == parent.id, Run.commit_id == commit.id)).one_or_none()
    if existing is not None:
        return None
    child = Run(
        commit_id=commit.id,
        profile=parent.profile,
        status=RunStatus.queued,
        purpose=purpose,
        parent_run_id=parent.id,
        seed_attempt=seed_attempt,
        max_attempts=parent.max_attempts,
    )
    session.add(child)
    session.flush()
    return child


def _unchanged_cases(session: Session, run: Run, cases: dict[str, CaseResult]) -> list[str]:
    """Cases whose seeded output fingerprint equals the previous tested commit's on the branch."""
    previous = _newest_before(session, run, RunStatus.passed, RunStatus.failed)
    if previous is None:
        return []
    before = _cases(session, previous.id)
    return sorted(
        case_id
        for case_id, case in cases.items()
        if case.fingerprint and case_id in before and before[case_id].fingerprint == case.fingerprint
    )


def _branch_runs(run: Run) -> Select[Any]:
    """Finished non-confirmation runs of ``run``'s profile on the commits of its branch before its commit."""
    commit = run.commit
    on_branch = Commit.branch.is_(None) if commit.branch is None else Commit.branch == commit.branch
    return (
        select(Run)
        .join(Commit, Run.commit_id == Commit.id)
        .where(
            Commit.target_id == commit.target_id,
            on_branch,
            Commit.branch_order < (commit.branch_order or 0),
            Run.profile == run.profile,
            Run.purpose != RunPurpose.confirmation,
        )
    )


def _newest_before(session: Session, run: Run, *statuses: RunStatus) -> Run | None:
    """The newest of ``_branch_runs(run)`` in one of ``statuses``."""
    query = _branch_runs(run).where(Run.status.in_(statuses))
    newest: Run | None = session.scalars(query.order_by(Commit.branch_order.desc(), Run.id.desc()).limit(1)).first()
    return newest


# ------------------------------------------------------------------------------------------------- drift
def _drift(session: Session, run: Run, cases: dict[str, CaseResult], config: AnalysisConfig) -> list[dict[str, Any]]:
    """Passing cases whose mean acceptance moved significantly from their last passing runs on the branch.

    Each case is tested at ``drift_alpha / m`` (m: the run's cases with an acceptance rate), so the run's
    false-alarm rate for drift is at most ``drift_alpha`` (Bonferroni; Hoeffding bound per case).
    """
    measured = [
        c
        for c in cases.values()
        if c.verdict is Verdict.pass_
        and c.acceptance_observed is not None
        and c.n_trials
        and case_gamma(c.case_id)
        and not c.case_id.startswith("edge/")  # deterministic paths, not samples of the acceptance rate
    ]
    if not measured:
        return []
    alpha = config.drift_alpha / len(measured)
    passing = _branch_runs(run).where(Run.status == RunStatus.passed)
    found: list[dict[str, Any]] = []
    for case in measured:
        gamma = case_gamma(case.case_id)
        assert gamma is not None
        rows = session.scalars(
            select(CaseResult)
            .join(Run, CaseResult.run_id == Run.id)
            .where(CaseResult.case_id == case.case_id, CaseResult.verdict == Verdict.pass_, Run.id.in_(passing.with_only_columns(Run.id)))
            .join(Commit, Run.commit_id == Commit.id)
            .order_by(Commit.branch_order.desc(), Run.id.desc())
            .limit(config.drift_baseline_runs)
        ).all()
        baseline = [
            AcceptanceSample(r.acceptance_observed, r.n_trials, gamma) for r in rows if r.acceptance_observed is not None and r.n_trials
        ]
        current = AcceptanceSample(case.acceptance_observed or 0.0, case.n_trials or 0, gamma)
        drift = acceptance_drift(current, baseline, alpha)
        if drift is None or not drift.significant:
            continue
        n_b = sum(b.trials for b in baseline)
        entry = _entry(case, "drift")
        entry.update(
            difference=drift.difference,
            radius=drift.radius,
            alpha=alpha,
            baseline_mean=sum(b.mean * b.trials for b in baseline) / n_b,
            baseline_trials=n_b,
            gamma=gamma,
        )
        found.append(entry)
    return found


# ------------------------------------------------------------------------------------------ confirmation
def _evidence(case: CaseResult | None) -> CaseEvidence | None:
    """A stored case result as confirmation evidence (None when it measured nothing: error, skipped)."""
    if case is None or case.threshold is None or case.verdict in (Verdict.error, Verdict.skipped):
        return None
    details = case.details or {}
    checks = []
    for check in details.get("checks") or []:
        if not isinstance(check, dict) or "name" not in check:
            continue
        # Schema 1 results have no stopped e-value: their running maxima are not e-values, so they add nothing
        # to a product (-inf); a rejection in both runs still confirms.
        stopped = check.get("stopped_log_e_value", -math.inf)
        checks.append(CheckEvidence(str(check["name"]), str(check.get("layer", "")), bool(check.get("rejected")), stopped))
    if not checks and case.verdict is Verdict.fail:
        # No per-check evidence (schema 1 rows): the layer's rejection stands for its checks, so only a
        # rejection of the same layer in both runs confirms (the product route needs stopped e-values).
        failed = {LOSSLESS: case.lossless is False, CONFORMANCE: case.conformance is False}
        checks = [CheckEvidence(f"({layer})", layer, True, -math.inf) for layer, yes in failed.items() if yes]
    certain = set(details.get("certain") or [])
    if "certain" not in details and case.log_e_value is None and case.verdict is Verdict.fail:
        certain.add(_failure_reason(case))  # schema 1: log E None marked a certain violation of the failed layer
    return CaseEvidence(case.threshold, tuple(checks), frozenset(certain), raised=_raised(case))


def _failed_layers(case: CaseResult) -> list[str]:
    """The layers a failing case failed in, worst first: what its confirmation may confirm."""
    layers = [LOSSLESS] if case.lossless is False else []
    if _raised(case):
        layers.append(RAISED)
    if case.conformance is False:
        layers.append(CONFORMANCE)
    return layers or [_failure_reason(case)]


def _analyse_confirmation(ctx: _Context, run: Run, cases: dict[str, CaseResult], analysis: dict[str, Any]) -> None:
    session = ctx.session
    parent = _lock_run(session, run.parent_run_id) if run.parent_run_id is not None else None
    if parent is None:
        analysis["confirmed"] = False
        return
    first = _cases(session, parent.id)
    failing: list[str] = list((parent.analysis or {}).get("failing") or [])
    entries: list[dict[str, Any]] = []
    for case_id in failing:
        before, again = _evidence(first.get(case_id)), _evidence(cases.get(case_id))
        if before is None or again is None:
            continue
        for layer in _failed_layers(first[case_id]):  # the alert's kind follows the layer that was confirmed
            confirmed_by = confirmation(before, again, layer)
            if confirmed_by is None:
                continue
            entry = _entry(first[case_id], layer)
            entry["confirmed_by"] = confirmed_by
            entry["confirmation_log_e_value"] = cases[case_id].log_e_value
            entry["confirmation_verdict"] = cases[case_id].verdict.value
            entries.append(entry)
            break
    analysis["confirmed"] = [e["case_id"] for e in entries]
    if entries or (parent.analysis or {}).get("known_failing"):  # a known failure still fails the commit
        status = "confirmed" if entries else "failure"
    else:
        status = "unconfirmable" if run.status is RunStatus.error else "not-confirmed"
    ctx.report.notifications += queue_commit_status(session, ctx.config.notify, parent, status)
    if not entries:
        log.info("failure_not_confirmed run_id=%s confirmation_run_id=%s", parent.id, run.id)
        return
    reasons = {e["reason"] for e in entries}
    kind = AlertKind.violation if LOSSLESS in reasons else AlertKind.exception if RAISED in reasons else AlertKind.performance
    analysis["confirmed_kind"] = kind.value
    _start_bisection(ctx, parent, kind, entries, confirmation=run, state=dict(parent.analysis or {}))


# --------------------------------------------------------------------------------------------- bisection
def _start_bisection(
    ctx: _Context,
    detected: Run,
    kind: AlertKind,
    entries: list[dict[str, Any]],
    *,
    confirmation: Run | None,
    state: dict[str, Any],
    after: Commit | None = None,
) -> None:
    """Search the first bad commit for ``entries``; ``after``: a known good commit that bounds the search
    (a drift's baseline: older commits are measured against another baseline and say nothing)."""
    state["bisection"] = {
        "kind": kind.value,
        "cases": entries,
        "confirmation_run_id": confirmation.id if confirmation else None,
        "runs": 0,
        "done": False,
        "after_sha": after.sha if after is not None else None,
        "after_order": after.branch_order if after is not None else None,
    }
    _bisect_step(ctx, detected, state)


def _continue_bisection_of(ctx: _Context, run: Run) -> None:
    detected = _lock_run(ctx.session, run.parent_run_id) if run.parent_run_id is not None else None
    if detected is None or not (detected.analysis or {}).get("bisection"):
        return
    _bisect_step(ctx, detected, dict(detected.analysis or {}))


def _commit_outcome(runs: Sequence[Run], cases_of: dict[int, dict[str, CaseResult]], entries: Sequence[dict[str, Any]]) -> Outcome | None:
    """Good, bad or unknown (broken) for the alert's cases; None while its only runs are unfinished.

    Bad: one of the cases fails for its entry's reason (a lossless entry needs its losslessness to fail,
    not its conformance alone), or a drift case drifts from the baseline the alert measured it against.
    """
    finished = [r for r in runs if r.status in ANALYSABLE]
    if not finished:
        return None
    latest = max(finished, key=lambda r: r.id)
    if latest.status is RunStatus.error:
        return Outcome.UNKNOWN
    results = cases_of.get(latest.id, {})
    for entry in entries:
        case = results.get(entry["case_id"])
        if case is None:
            continue
        reason = entry.get("reason")
        if reason == "drift":
            if case.verdict is Verdict.fail or _still_drifting(entry, case):
                return Outcome.BAD
        elif case.verdict is Verdict.fail and (reason == CONFORMANCE or case.lossless is False or (reason == RAISED and _raised(case))):
            return Outcome.BAD
    return Outcome.GOOD


def _bisect_step(ctx: _Context, detected: Run, state: dict[str, Any]) -> None:
    session, report = ctx.session, ctx.report
    bisection = dict(state["bisection"])
    if bisection.get("done"):
        return
    commit = detected.commit
    on_branch = Commit.branch.is_(None) if commit.branch is None else Commit.branch == commit.branch
    after_order = bisection.get("after_order")
    commits = list(
        session.scalars(
            select(Commit)
            .where(
                Commit.target_id == commit.target_id,
                on_branch,
                Commit.branch_order <= (commit.branch_order or 0),
                Commit.branch_order >= (after_order if after_order is not None else 0),
            )
            .order_by(Commit.branch_order)
        )
    )
    runs = list(
        session.scalars(
            select(Run).where(
                Run.commit_id.in_([c.id for c in commits]), Run.profile == detected.profile, Run.purpose != RunPurpose.confirmation
            )
        )
    )
    cases_of: dict[int, dict[str, CaseResult]] = {}
    for case in session.scalars(select(CaseResult).where(CaseResult.run_id.in_([r.id for r in runs]))):
        cases_of.setdefault(case.run_id, {})[case.case_id] = case
    entries = list(bisection["cases"])
    outcomes: dict[str, Outcome] = {}
    # Commits whose run for this search is still going: its analysis resumes the search. Another run of the
    # commit (its own primary run, another search's) would not, so the search queues its own then.
    in_flight: set[str] = set()
    for c in commits:
        mine = [r for r in runs if r.commit_id == c.id]
        outcome = _commit_outcome(mine, cases_of, entries)
        if outcome is not None:
            outcomes[c.sha] = outcome
        elif any(r.parent_run_id == detected.id for r in mine):
            in_flight.add(c.sha)
    if bisection.get("after_sha"):
        outcomes[bisection["after_sha"]] = Outcome.GOOD
    outcomes[commit.sha] = Outcome.BAD
    decision = bisect([c.sha for c in commits], outcomes)
    by_sha = {c.sha: c for c in commits}
    if decision.next_to_test is not None:
        if decision.next_to_test not in in_flight:
            child = _child_run(session, detected, by_sha[decision.next_to_test], RunPurpose.bisection)
            if child is not None:
                report.queued.append(child.id)
                bisection["runs"] = int(bisection["runs"]) + 1
        bisection["next"] = decision.next_to_test
        state["bisection"] = bisection
        detected.analysis = state
        return
    bisection["done"] = True
    bisection["first_bad"] = decision.first_bad
    bisection["last_good"] = decision.last_good
    state["bisection"] = bisection
    detected.analysis = state
    first_bad = by_sha[decision.first_bad] if decision.first_bad else commit
    last_good = by_sha.get(decision.last_good) if decision.last_good else None
    confirmation_id = bisection.get("confirmation_run_id")
    confirmation = session.get(Run, confirmation_id) if confirmation_id else None
    _open_alert(
        ctx,
        detected,
        AlertKind(bisection["kind"]),
        first_bad,
        list(bisection["cases"]),
        last_good=last_good,
        confirmation=confirmation,
        bisection_runs=int(bisection["runs"]),
    )


# ------------------------------------------------------------------------------------------------ alerts
def _insert_ignoring_conflict(session: Session, values: dict[str, Any]) -> int | None:
    """INSERT the alert unless its (target, branch, first bad commit, kind) exists; its id, or None."""
    keys = ["target_id", "branch", "first_bad_commit_id", "kind"]
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        pg = postgresql.insert(Alert).values(**values).on_conflict_do_nothing(index_elements=keys).returning(Alert.id)
        return session.execute(pg).scalar_one_or_none()
    lite = sqlite.insert(Alert).values(**values).on_conflict_do_nothing(index_elements=keys).returning(Alert.id)
    return session.execute(lite).scalar_one_or_none()


def _summary(kind: AlertKind, target: Target, branch: str, first_bad: Commit, entries: list[dict[str, Any]]) -> str:
    what = {
        AlertKind.violation: "losslessness violation",
        AlertKind.performance: "performance regression",
        AlertKind.broken: "broken commit",
        AlertKind.exception: "sampler exception on a valid input",
    }[kind]
    cases = "" if kind is AlertKind.broken else f" ({len(entries)} case{'s' if len(entries) != 1 else ''})"
    return f"{what} in {target.name} {branch} at {first_bad.sha[:12]}{cases}"


def _open_alert(
    ctx: _Context,
    detected: Run,
    kind: AlertKind,
    first_bad: Commit,
    entries: list[dict[str, Any]],
    *,
    last_good: Commit | None = None,
    confirmation: Run | None = None,
    bisection_runs: int = 0,
) -> None:
    session, report, config, now = ctx.session, ctx.report, ctx.config, ctx.now
    target = detected.commit.target
    branch = alert_branch(first_bad)
    values: dict[str, Any] = {
        "target_id": target.id,
        "branch": branch,
        "first_bad_commit_id": first_bad.id,
        "kind": kind,
        "state": AlertState.open,
        "detected_run_id": detected.id,
        "confirmation_run_id": confirmation.id if confirmation else None,
        "last_good_commit_id": last_good.id if last_good else None,
        "confirmed": confirmation is not None,
        "bisection_runs": bisection_runs,
        "cases": entries,
        "summary": _summary(kind, target, branch, first_bad, entries),
        "created_at": now,
    }
    alert_id = _insert_ignoring_conflict(session, values)
    if alert_id is not None:
        alert = session.get_one(Alert, alert_id)
        report.opened.append(alert_id)
        report.notifications += queue_alert_message(session, config.notify, alert, "opened")
        log.warning("alert_opened alert_id=%s kind=%s target=%s first_bad=%s", alert_id, kind.value, target.name, first_bad.sha)
        return
    existing = session.scalars(
        select(Alert)
        .where(Alert.target_id == target.id, Alert.branch == branch, Alert.first_bad_commit_id == first_bad.id, Alert.kind == kind)
        .with_for_update()
    ).one()
    known = {e["case_id"] for e in existing.cases}
    new = [e for e in entries if e["case_id"] not in known]
    if new:
        existing.cases = [*existing.cases, *new]
        report.merged.append(existing.id)


def _still_drifting(entry: dict[str, Any], case: CaseResult) -> bool:
    if case.acceptance_observed is None or not case.n_trials:
        return True
    baseline = AcceptanceSample(float(entry["baseline_mean"]), int(entry["baseline_trials"]), int(entry["gamma"]))
    drift = acceptance_drift(AcceptanceSample(case.acceptance_observed, case.n_trials, baseline.gamma), [baseline], float(entry["alpha"]))
    return drift is None or drift.significant


def _recovered(alert: Alert, run: Run, cases: dict[str, CaseResult]) -> bool:
    if alert.kind is AlertKind.broken:
        return run.status is not RunStatus.error
    for entry in alert.cases:
        case = cases.get(entry["case_id"])
        if case is None or case.verdict is not Verdict.pass_:
            return False
        if entry.get("reason") == "drift" and _still_drifting(entry, case):
            return False
    return True


def _resolve_recovered(ctx: _Context, run: Run, cases: dict[str, CaseResult]) -> None:
    """Resolve the open alerts of the branch whose cases all pass in this later commit's run."""
    session, report, config, now = ctx.session, ctx.report, ctx.config, ctx.now
    commit = run.commit
    candidates = session.scalars(
        select(Alert)
        .join(Commit, Alert.first_bad_commit_id == Commit.id)
        .where(
            Alert.target_id == commit.target_id,
            Alert.branch == alert_branch(commit),
            Alert.state != AlertState.resolved,
            Commit.branch_order < (commit.branch_order or 0),
        )
        .order_by(Alert.id)
        .with_for_update(of=Alert)
    ).all()
    for alert in candidates:
        if not _recovered(alert, run, cases):
            continue
        alert.state = AlertState.resolved
        alert.resolved_at = now
        alert.resolved_by_commit_id = commit.id
        report.resolved.append(alert.id)
        report.notifications += queue_alert_message(session, config.notify, alert, "resolved")
        log.info("alert_resolved alert_id=%s by=%s", alert.id, commit.sha)


def acknowledge(session: Session, alert_id: int, *, now: datetime) -> Alert | None:
    """open → acknowledged (someone is on it); other states are left alone."""
    alert = session.scalars(select(Alert).where(Alert.id == alert_id).with_for_update()).one_or_none()
    if alert is not None and alert.state is AlertState.open:
        alert.state = AlertState.acknowledged
        alert.acknowledged_at = now
        session.flush()
    return alert


def unanalysed(session: Session, *, now: datetime, grace: timedelta, horizon: timedelta, limit: int = 200) -> list[int]:
    """Finished runs nobody analysed (their message was lost) within ``horizon``, finished over ``grace`` ago."""
    return list(
        session.scalars(
            select(Run.id)
            .where(
                Run.status.in_(ANALYSABLE),
                Run.analysed_at.is_(None),
                Run.finished_at < now - grace,
                Run.finished_at > now - horizon,
            )
            .order_by(Run.id)
            .limit(limit)
        )
    )
