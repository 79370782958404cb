"""Resolution: a later run whose cases all pass again resolves the open alerts of its branch; a run that installed
its commit resolves the uninstallable alerts of that commit and the ones before it."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select

from service.history import on_branch, open_alerts
from service.models import Alert, AlertKind, AlertState, CaseResult, Commit, Run, RunStatus, Verdict
from service.models.entries import AlertEntry, alert_entries
from service.notifications.slack import queue_alert_message
from workers.analysis.context import Analysis, load_cases
from workers.analysis.drift import still_drifting
from workers.analysis.fixes import fails_again, start_fix_search
from workers.analysis.state import RunAnalysis

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


def track_fixes(alert: Alert, run: Run, cases: dict[str, CaseResult]) -> list[str]:
    """Mark each case of ``alert`` that passes in ``run`` fixed at its commit (``fixed_sha``, ``fixed_order``: the
    earliest such commit known), and unmark one that fails the same way again at or after its fix; the cases newly
    fixed here. A case's fix is its own event, whatever its alert's other cases do."""
    commit = run.commit
    order = commit.branch_order or 0
    before = alert_entries(alert.cases)
    entries: list[dict[str, Any]] = [dict(e) for e in before]
    fixed: list[str] = []
    for typed, entry in zip(before, entries, strict=True):
        case = cases.get(typed["case_id"])
        at = fixed_at(typed)
        if case is not None and case.verdict is Verdict.PASS and not fails_again(typed, case):
            if at is None or order < at[1]:
                if at is None:
                    fixed.append(typed["case_id"])
                entry["fixed_sha"], entry["fixed_order"] = commit.sha, order
        elif at is not None and order >= at[1] and fails_again(typed, case):
            del entry["fixed_sha"], entry["fixed_order"]  # it came back: not fixed after all
    if entries != [dict(e) for e in before]:
        alert.cases = alert_entries(entries)
    return fixed


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
        fixed = track_fixes(alert, run, cases)
        fixed_here += fixed
        if fixed:
            start_fix_search(ctx, run, analysis, alert, fixed)
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
        fixed += track_fixes(alert, run, load_cases(ctx.session, run.id))
        if all(fixed_at(e) for e in alert_entries(alert.cases)):
            resolve(ctx, alert, run)
            return
    if fixed:
        ctx.report.notifications += queue_alert_message(ctx.session, ctx.config.notify, alert, "fixed", about=fixed)
        log.info("alert_cases_fixed alert_id=%s cases=%s (runs analysed before it opened)", alert.id, fixed)


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
