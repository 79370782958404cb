"""Opening an alert once its first bad commit is known, exactly once however many workers find it.

``INSERT .. ON CONFLICT DO NOTHING`` on (target, branch, first bad commit, kind): two workers naming the same
first bad commit make one alert (the second merges its cases into it), and the outbox rows are written only by
the insert that created it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from service.db import insert_ignoring_conflicts
from service.history import alert_branch
from service.models import Alert, AlertKind, AlertState, Commit, Run, Target
from service.models.entries import AlertEntry, alert_entries
from service.notifications.slack import queue_alert_message
from workers.analysis.context import Analysis
from workers.analysis.resolution import catch_up_fixes, end_superseded

log = logging.getLogger(__name__)

_WHAT = {
    AlertKind.violation: "losslessness violation",
    AlertKind.performance: "performance regression",
    AlertKind.broken: "broken commit",
    AlertKind.exception: "sampler exception on a valid input",
    AlertKind.uninstallable: "could not install",
    AlertKind.configuration: "configuration error",
}


def summary(kind: AlertKind, target: Target, branch: str, first_bad: Commit, entries: Sequence[AlertEntry]) -> str:
    if kind is AlertKind.uninstallable:
        requirement = next((e["requirement"] for e in entries if e["reason"] == "uninstallable" and e["requirement"]), None)
        return f"could not install {target.name} {first_bad.sha[:24]}" + (f": {requirement}" if requirement else "")
    if kind is AlertKind.configuration:
        cause = next((e["error"] for e in entries if e["reason"] == "configuration" and e["error"]), None)
        return f"configuration error of {target.name}: its repository cannot be used" + (f" ({cause[:300]})" if cause else "")
    cases = "" if kind is AlertKind.broken else f" ({len(entries)} case{'s' if len(entries) != 1 else ''})"
    return f"{_WHAT[kind]} in {target.name} {branch} at {first_bad.sha[:12]}{cases}"


def open_alert(
    ctx: Analysis,
    detected: Run,
    kind: AlertKind,
    first_bad: Commit,
    entries: Sequence[AlertEntry],
    *,
    last_good: Commit | None = None,
    confirmation: Run | None = None,
    bisection_runs: int = 0,
) -> None:
    """Open the alert of ``kind`` at ``first_bad`` with ``entries``, or merge new entries into the existing one."""
    session, report = ctx.session, ctx.report
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
        "cases": list(entries),
        "summary": summary(kind, target, branch, first_bad, entries),
        "created_at": ctx.now,
    }
    keys = [Alert.target_id, Alert.branch, Alert.first_bad_commit_id, Alert.kind]
    insert = insert_ignoring_conflicts(session, Alert, values, keys)
    if insert is None:
        dialect = session.get_bind().dialect.name
        raise NotImplementedError(f"opening an alert needs an insert that ignores conflicts, which the {dialect} dialect lacks")
    alert_id = session.execute(insert.returning(Alert.id)).scalar_one_or_none()
    if alert_id is not None:
        alert = session.get_one(Alert, alert_id)
        report.opened.append(alert_id)
        report.notifications += queue_alert_message(session, ctx.config.notify, alert, "opened")
        log.warning("alert_opened alert_id=%s kind=%s target=%s first_bad=%s", alert_id, kind.value, target.name, first_bad.sha)
        catch_up_fixes(ctx, alert)  # later commits analysed before it opened
        end_superseded(ctx, alert, detected)  # the failures it replaces end where it begins
        return
    existing = session.scalars(
        select(Alert)
        .where(Alert.target_id == target.id, Alert.branch == branch, Alert.first_bad_commit_id == first_bad.id, Alert.kind == kind)
        .with_for_update()
    ).one()
    known = {e["case_id"] for e in alert_entries(existing.cases)}
    new = [e for e in entries if e["case_id"] not in known]
    if new:
        existing.cases = [*alert_entries(existing.cases), *new]
        end_superseded(ctx, existing, detected)
    if existing.state is AlertState.resolved:
        reopen(ctx, existing, detected)
    elif new:
        report.merged.append(existing.id)


def reopen(ctx: Analysis, alert: Alert, detected: Run) -> None:
    """Open resolved ``alert`` again, visibly: its finding is back (the same first bad commit named once more).

    Never a quiet merge: the alert counts the reopening and Slack gets a "reopened" message.
    """
    alert.state = AlertState.open
    alert.resolved_at = None
    alert.resolved_by_commit_id = None
    alert.acknowledged_at = None
    alert.detected_run_id = detected.id
    alert.reopened_count += 1
    alert.reopened_at = ctx.now
    ctx.session.flush()
    ctx.report.reopened.append(alert.id)
    ctx.report.notifications += queue_alert_message(ctx.session, ctx.config.notify, alert, "reopened")
    log.warning("alert_reopened alert_id=%s kind=%s times=%s", alert.id, alert.kind.value, alert.reopened_count)
