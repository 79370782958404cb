"""Resolution: a later run whose cases all pass again resolves the open alerts of its branch; a run that installed
its commit resolves the uninstallable alerts of that commit and the ones before it."""

from __future__ import annotations

import logging

from service.history import open_alerts
from service.models import Alert, AlertKind, AlertState, CaseResult, Run, RunStatus, Verdict
from workers.analysis.context import Analysis
from workers.analysis.drift import still_drifting
from workers.notify import queue_alert_message

log = logging.getLogger(__name__)


def recovered(alert: Alert, run: Run, cases: dict[str, CaseResult]) -> bool:
    """Does ``run`` (of a later commit) show ``alert``'s finding gone: every case passing, no drift left?"""
    if alert.kind is AlertKind.broken:
        return run.status is not RunStatus.error
    if alert.kind is AlertKind.uninstallable:
        return run.status is not RunStatus.uninstallable
    for entry in alert.cases:
        case = cases.get(entry["case_id"])
        if case is None or case.verdict is not Verdict.PASS:
            return False
        if entry.get("reason") == "drift" and still_drifting(entry, case):
            return False
    return True


def resolve_recovered(ctx: Analysis, run: Run, cases: dict[str, CaseResult]) -> None:
    """Resolve the open alerts of the branch, begun before this commit, whose cases all pass in ``run``."""
    for alert in open_alerts(ctx.session, run.commit, at_commit=False, lock=True):
        if alert.kind is not AlertKind.uninstallable and recovered(alert, run, cases):
            resolve(ctx, alert, run)


def resolve_installed(ctx: Analysis, run: Run) -> None:
    """Resolve the branch's uninstallable alerts at or before ``run``'s commit: it installed (the same release
    retried later, or a newer one: whatever was missing can be installed now)."""
    for alert in open_alerts(ctx.session, run.commit, at_commit=True, kinds=[AlertKind.uninstallable], lock=True):
        if recovered(alert, run, {}):
            resolve(ctx, alert, run)


def resolve(ctx: Analysis, alert: Alert, run: Run) -> None:
    """Resolve ``alert`` by ``run``'s commit, with a "resolved" notification."""
    commit = run.commit
    alert.state = AlertState.resolved
    alert.resolved_at = ctx.now
    alert.resolved_by_commit_id = commit.id
    ctx.report.resolved.append(alert.id)
    ctx.report.notifications += queue_alert_message(ctx.session, ctx.config.notify, alert, "resolved")
    log.info("alert_resolved alert_id=%s kind=%s by=%s", alert.id, alert.kind.value, commit.sha)
