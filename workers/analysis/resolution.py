"""Resolution: each case of an open alert ends at the later commit where it passes again, or fails another way (as a
known finding, or as another alert that supersedes its signature); the alert resolves when its last case has ended. A
run that installed its commit resolves the uninstallable alerts of that commit and the ones before it."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select

from service.history import on_branch, open_alerts
from service.models import Alert, AlertKind, AlertState, CaseResult, Commit, Run, RunStatus, Verdict
from service.models.entries import AlertEntry, alert_entries
from service.notifications.slack import queue_alert_message
from workers.analysis.context import Analysis, load_cases
from workers.analysis.decisions import CONFORMANCE, LOSSLESS, Signature, signatures_differ
from workers.analysis.drift import still_drifting
from workers.analysis.fixes import fails_again, start_fix_search
from workers.analysis.state import RunAnalysis, load_analysis
from workers.analysis.triage import FailureReason, failure_alert_spans, failure_reason, signature

log = logging.getLogger(__name__)


def recovered(alert: Alert, run: Run, cases: dict[str, CaseResult]) -> bool:
    """Does ``run`` (of a later commit) show ``alert``'s finding gone: every case passing, no drift left?"""
    if alert.kind is AlertKind.broken:
        return run.status is not RunStatus.error
    if alert.kind is AlertKind.uninstallable:
        return run.status is not RunStatus.uninstallable
    for entry in alert_entries(alert.cases):
        case = cases.get(entry["case_id"])
        if case is None or case.verdict is not Verdict.PASS:
            return False
        if entry["reason"] == "drift" and still_drifting(entry, case):
            return False
    return True


def fixed_at(entry: AlertEntry) -> tuple[str, int] | None:
    """The commit (sha, branch position) at which ``entry``'s case was seen fixed; None while it is not."""
    sha, order = entry.get("fixed_sha"), entry.get("fixed_order")
    return (sha, order) if isinstance(sha, str) and isinstance(order, int) else None


def _recorded(entry: AlertEntry) -> Signature | None:
    stored = entry.get("signature")
    return Signature.from_dict(stored) if isinstance(stored, dict) else None


def fails_its_way(entry: AlertEntry, case: CaseResult | None) -> bool:
    """Does ``case`` fail the way ``entry`` says its case failed: its reason (:func:`fails_again`), and a signature
    that does not differ from the entry's (an entry without one: any)?"""
    if not fails_again(entry, case) or case is None:
        return False
    old, reason = _recorded(entry), _FAILURES.get(entry["reason"])
    return old is None or reason is None or not signatures_differ(signature(case, reason), old)


#: The entry reasons of failing cases (what a signature is computed for).
_FAILURES: dict[str, FailureReason] = {"lossless": "lossless", "conformance": "conformance", "raised": "raised"}


def fails_otherwise(entry: AlertEntry, case: CaseResult | None) -> bool:
    """Does ``case`` fail, but another way than ``entry`` records (its worst failure's signature differs from the
    entry's, as triage tells a new failure from a standing one)? Never for an entry without a signature."""
    old = _recorded(entry)
    if case is None or case.verdict is not Verdict.FAIL or old is None or entry["reason"] == "drift":
        return False
    reason = failure_reason(case)
    if reason == CONFORMANCE and entry["reason"] == LOSSLESS:
        return False  # a known lossless failure covers the case failing conformance only (triage.new_failures)
    return signatures_differ(signature(case, reason), old)


def track_fixes(alert: Alert, run: Run, cases: dict[str, CaseResult], explained: Mapping[str, str] | None = None) -> list[str]:
    """Mark each case of ``alert`` whose failure ends in ``run`` fixed at its commit (``fixed_sha``, ``fixed_order``:
    the earliest such commit known), and unmark one that fails the alert's way again at or after its end; the cases
    newly fixed here. A case's failure ends when it passes, or when it fails another way that a known finding
    explains (``explained``: case -> finding key; ``now_fails_as`` names the finding). A case's end is its own event,
    whatever its alert's other cases do."""
    commit = run.commit
    order = commit.branch_order or 0
    explained = explained or {}
    before = alert_entries(alert.cases)
    entries: list[dict[str, Any]] = [dict(e) for e in before]
    fixed: list[str] = []
    for typed, entry in zip(before, entries, strict=True):
        case_id = typed["case_id"]
        case = cases.get(case_id)
        at = fixed_at(typed)
        passes = case is not None and case.verdict is Verdict.PASS and not fails_again(typed, case)
        finding = explained.get(case_id) if fails_otherwise(typed, case) else None
        if (passes or finding is not None) and (at is None or order < at[1]):
            if at is None:
                fixed.append(case_id)
            entry["fixed_sha"], entry["fixed_order"] = commit.sha, order
            entry.pop("now_fails_as", None)
            if finding is not None:
                entry["now_fails_as"] = {"finding": finding}
        elif at is not None and order >= at[1] and fails_its_way(typed, case):
            for key in ("fixed_sha", "fixed_order", "now_fails_as"):  # it came back: not ended after all
                entry.pop(key, None)
    if entries != [dict(e) for e in before]:
        alert.cases = alert_entries(entries)
    return fixed


def _by_case(findings: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """A run's ``analysis.findings`` (finding key -> its cases) by case."""
    return {case_id: key for key, case_ids in findings.items() for case_id in case_ids}


def _passed(alert: Alert, cases: Sequence[str]) -> list[str]:
    """Those of ``cases`` that ``alert`` has fixed by a pass (not ended by another failure: no fix search for them)."""
    return [e["case_id"] for e in alert_entries(alert.cases) if e["case_id"] in cases and not e.get("now_fails_as")]


def resolve_recovered(ctx: Analysis, run: Run, cases: dict[str, CaseResult], analysis: RunAnalysis) -> list[str]:
    """Track the fixes of the open alerts' cases of the branch, begun before this commit (:func:`track_fixes`);
    announce each case fixed here, search the first good commit where commits before this one were skipped
    (:mod:`workers.analysis.fixes`), and resolve an alert once its last case is fixed (a broken commit's alert: once
    a later commit is not broken). The cases fixed here."""
    fixed_here: list[str] = []
    for alert in open_alerts(ctx.session, run.commit, at_commit=False, lock=True):
        if alert.kind is AlertKind.uninstallable:
            continue
        if alert.kind is AlertKind.broken or alert.kind is AlertKind.configuration:
            if recovered(alert, run, cases):
                resolve(ctx, alert, run)
            continue
        fixed = track_fixes(alert, run, cases, _by_case(analysis.findings))
        fixed_here += fixed
        if _passed(alert, fixed):
            start_fix_search(ctx, run, analysis, alert, _passed(alert, fixed))
        if all(fixed_at(e) for e in alert_entries(alert.cases)):
            resolve(ctx, alert, run)
        elif fixed:
            ctx.report.notifications += queue_alert_message(ctx.session, ctx.config.notify, alert, "fixed", about=fixed)
            log.info("alert_cases_fixed alert_id=%s cases=%s at=%s", alert.id, fixed, run.commit.sha)
    return fixed_here


def catch_up_fixes(ctx: Analysis, alert: Alert) -> None:
    """Read the later commits' runs that were analysed before ``alert`` opened, in branch order, as
    :func:`resolve_recovered` would have read them had the alert stood then: its cases fixed there are announced, and
    it resolves if its last case is. A confirmation or a search can take longer than the next commits' own runs (a
    push of several commits, a replayed history): their passes would otherwise never count as fixes."""
    first = ctx.session.get(Commit, alert.first_bad_commit_id)
    if first is None or alert.kind not in (AlertKind.violation, AlertKind.performance, AlertKind.exception):
        return
    later = ctx.session.scalars(
        select(Run)
        .join(Commit, Run.commit_id == Commit.id)
        .where(
            Commit.target_id == alert.target_id,
            on_branch(first.branch),
            Commit.branch_order > (first.branch_order or 0),
            Run.status.in_([RunStatus.passed, RunStatus.failed]),
        )
        .order_by(Commit.branch_order, Run.id)
    ).all()
    latest: dict[int, Run] = {}
    for run in later:
        latest[run.commit_id] = run  # the commit's latest finished run decides, as at its own analysis
    fixed: list[str] = []
    for run in latest.values():
        fixed += track_fixes(alert, run, load_cases(ctx.session, run.id), _by_case(load_analysis(run).findings))
        if all(fixed_at(e) for e in alert_entries(alert.cases)):
            resolve(ctx, alert, run)
            return
    if fixed:
        ctx.report.notifications += queue_alert_message(ctx.session, ctx.config.notify, alert, "fixed", about=fixed)
        log.info("alert_cases_fixed alert_id=%s cases=%s (runs analysed before it opened)", alert.id, fixed)


def end_superseded(ctx: Analysis, alert: Alert, detected: Run) -> None:
    """``alert``'s entries that supersede another signature of their case end that failure: in each earlier failure
    alert of the branch whose entry for the case records the superseded signature (and was not fixed before), the
    case is fixed at ``alert``'s first bad commit (the first commit with the new signature), ``now_fails_as`` naming
    ``alert``; an open alert resolves when that was its last case (``detected``: the run that opened ``alert``). A
    resolved one (it was resolved by a later commit before ``alert`` opened) moves its resolving commit there."""
    replacing: dict[str, dict[str, Any]] = {}
    for e in alert_entries(alert.cases):
        replaced = e.get("supersedes")
        if isinstance(replaced, dict):
            replacing[e["case_id"]] = replaced
    if not replacing:
        return
    first_bad = ctx.session.get_one(Commit, alert.first_bad_commit_id)
    order = first_bad.branch_order or 0
    for other, began, _ in failure_alert_spans(ctx.session, first_bad):
        if other.id == alert.id or began >= order:
            continue
        entries: list[dict[str, Any]] = [dict(e) for e in alert_entries(other.cases)]
        ended = []
        for entry in entries:
            replaced = replacing.get(entry["case_id"])
            old = entry.get("signature")
            if replaced is None or not isinstance(old, dict) or entry["reason"] != replaced.get("reason"):
                continue
            if signatures_differ(Signature.from_dict(old), Signature.from_dict(replaced)) or entry.get("fixed_order", order + 1) <= order:
                continue
            entry["fixed_sha"], entry["fixed_order"], entry["now_fails_as"] = first_bad.sha, order, {"alert": alert.id}
            ended.append(entry["case_id"])
        if ended:
            other.cases = alert_entries(entries)
            _ended(ctx, other, detected, ended)


def _ended(ctx: Analysis, alert: Alert, detected: Run, cases: list[str]) -> None:
    """Announce ``cases`` of ``alert`` ended (superseded), resolving it when they were its last; a resolved alert's
    resolving commit moves to its last case's end."""
    log.info("alert_cases_superseded alert_id=%s cases=%s", alert.id, cases)
    if alert.state is AlertState.open:
        if all(fixed_at(e) for e in alert_entries(alert.cases)):
            resolve(ctx, alert, detected)
        else:
            ctx.report.notifications += queue_alert_message(ctx.session, ctx.config.notify, alert, "fixed", about=cases)
        return
    ends = [at for at in (fixed_at(e) for e in alert_entries(alert.cases)) if at is not None]
    if alert.resolved_by_commit_id is not None and len(ends) == len(alert_entries(alert.cases)):
        last, _ = max(ends, key=lambda at: at[1])
        found = ctx.session.scalars(select(Commit).where(Commit.target_id == alert.target_id, Commit.sha == last)).first()
        alert.resolved_by_commit_id = found.id if found is not None else alert.resolved_by_commit_id


def resolve_installed(ctx: Analysis, run: Run) -> None:
    """Resolve the branch's uninstallable alerts at or before ``run``'s commit: it installed (the same release
    retried later, or a newer one: whatever was missing can be installed now)."""
    for alert in open_alerts(ctx.session, run.commit, at_commit=True, kinds=[AlertKind.uninstallable], lock=True):
        if recovered(alert, run, {}):
            resolve(ctx, alert, run)


def resolve(ctx: Analysis, alert: Alert, run: Run) -> None:
    """Resolve ``alert`` with a "resolved" notification: by the commit that fixed its last case (``run``'s
    commit, or an earlier one a search found), else by ``run``'s commit."""
    commit = run.commit
    fixes = [at for at in (fixed_at(e) for e in alert_entries(alert.cases)) if at is not None]
    if fixes and len(fixes) == len(alert_entries(alert.cases)):
        last, _ = max(fixes, key=lambda at: at[1])
        found = ctx.session.scalars(select(Commit).where(Commit.target_id == alert.target_id, Commit.sha == last)).first()
        commit = found or commit
    alert.state = AlertState.resolved
    alert.resolved_at = ctx.now
    alert.resolved_by_commit_id = commit.id
    ctx.report.resolved.append(alert.id)
    ctx.report.notifications += queue_alert_message(ctx.session, ctx.config.notify, alert, "resolved")
    log.info("alert_resolved alert_id=%s kind=%s by=%s", alert.id, alert.kind.value, commit.sha)
