"""Resolution: a later run whose cases all pass again resolves the open alerts of its branch."""

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
    for entry in alert.cases:
        case = cases.get(entry["case_id"])
        if case is None or case.verdict is not Verdict.pass_:
            return False
        if entry.get("reason") == "drift" and still_drifting(entry, case):
            return False
    return True


def resolve_recovered(ctx: Analysis, run: Run, cases: dict[str, CaseResult]) -> None:
    """Resolve the open alerts of the branch, begun before this commit, whose cases all pass in ``run``."""
    commit = run.commit
    for alert in open_alerts(ctx.session, commit, at_commit=False, lock=True):
        if not recovered(alert, run, cases):
            continue
        alert.state = AlertState.resolved
        alert.resolved_at = ctx.now
        alert.resolved_by_commit_id = commit.id
        ctx.report.resolved.append(alert.id)
        ctx.report.notifications += queue_alert_message(ctx.session, ctx.config.notify, alert, "resolved")
        log.info("alert_resolved alert_id=%s by=%s", alert.id, commit.sha)
