"""Alerts: listed and filtered, one by id (each with the known findings that explain its cases), acknowledged or
counted by kind and state (acknowledged or resolved by hand: :mod:`service.alerts`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Alert, AlertKind, AlertState, Commit, Target
from service.models.entries import AlertEntry, alert_entries
from service.queries.common import MAX_PAGE, NotFoundError, QueryError, get_target
from service.queries.findings import FindingLink, FindingMatcher, alert_findings, alert_regressions, finding_matcher


@dataclass(frozen=True)
class AlertRow:
    id: int
    target: str
    branch: str
    kind: AlertKind
    state: AlertState
    first_bad_sha: str
    first_bad_order: int | None
    last_good_sha: str | None
    detected_run_id: int | None
    confirmation_run_id: int | None
    confirmed: bool
    bisection_runs: int
    cases: tuple[AlertEntry, ...]
    summary: str | None
    created_at: datetime | None
    acknowledged_at: datetime | None
    resolved_at: datetime | None
    # The commit whose run resolved it (the one that fixed its last case); None while open or resolved by hand.
    resolved_sha: str | None = None
    # The known findings that explain some of its cases, by case id (service.queries.findings).
    findings: dict[str, FindingLink] = field(default_factory=dict)
    # The fixed known findings that some of its cases bring back (a regression of each), by case id.
    regressions: dict[str, FindingLink] = field(default_factory=dict)


def alert_rows(session: Session, alerts: Sequence[Alert]) -> list[AlertRow]:
    commit_ids = (
        {a.first_bad_commit_id for a in alerts}
        | {a.last_good_commit_id for a in alerts if a.last_good_commit_id}
        | {a.resolved_by_commit_id for a in alerts if a.resolved_by_commit_id}
    )
    commits = {c.id: c for c in session.scalars(select(Commit).where(Commit.id.in_(commit_ids)))} if commit_ids else {}
    targets = dict(session.execute(select(Target.id, Target.name)).all()) if alerts else {}
    matchers: dict[int, FindingMatcher] = {}
    rows = []
    for alert in alerts:
        if alert.target_id not in matchers:
            matchers[alert.target_id] = finding_matcher(session, alert.target_id)
        bad = commits[alert.first_bad_commit_id]
        good = commits.get(alert.last_good_commit_id) if alert.last_good_commit_id else None
        rows.append(
            AlertRow(
                id=alert.id,
                target=targets[alert.target_id],
                branch=alert.branch,
                kind=alert.kind,
                state=alert.state,
                first_bad_sha=bad.sha,
                first_bad_order=bad.branch_order,
                last_good_sha=good.sha if good else None,
                detected_run_id=alert.detected_run_id,
                confirmation_run_id=alert.confirmation_run_id,
                confirmed=alert.confirmed,
                bisection_runs=alert.bisection_runs,
                cases=tuple(alert_entries(alert.cases)),
                summary=alert.summary,
                created_at=alert.created_at,
                acknowledged_at=alert.acknowledged_at,
                resolved_at=alert.resolved_at,
                resolved_sha=commits[alert.resolved_by_commit_id].sha if alert.resolved_by_commit_id in commits else None,
                findings=alert_findings(session, alert, matchers[alert.target_id]),
                regressions=alert_regressions(session, alert, matchers[alert.target_id]),
            )
        )
    return rows


def list_alerts(
    session: Session,
    *,
    target: str | None = None,
    state: AlertState | None = None,
    kind: AlertKind | None = None,
    branch: str | None = None,
    limit: int = 100,
    states: Collection[AlertState] | None = None,
) -> list[AlertRow]:
    """Alerts, newest first, filtered by target, state (or any of ``states``), kind and branch."""
    if not 1 <= limit <= MAX_PAGE:
        raise QueryError(f"limit must be between 1 and {MAX_PAGE}")
    query = select(Alert).order_by(Alert.id.desc()).limit(limit)
    if target is not None:
        query = query.where(Alert.target_id == get_target(session, target).id)
    if state is not None:
        query = query.where(Alert.state == state)
    if states is not None:
        query = query.where(Alert.state.in_(list(states)))
    if kind is not None:
        query = query.where(Alert.kind == kind)
    if branch is not None:
        query = query.where(Alert.branch == branch)
    return alert_rows(session, list(session.scalars(query)))


#: What "open" means on the alerts page: not resolved (open, or acknowledged: someone is on it).
UNRESOLVED = (AlertState.open, AlertState.acknowledged)


def get_alert(session: Session, alert_id: int) -> AlertRow:
    alert = session.get(Alert, alert_id)
    if alert is None:
        raise NotFoundError(f"no alert {alert_id}")
    return alert_rows(session, [alert])[0]


def alerts_by_state(session: Session) -> dict[tuple[AlertKind, AlertState], int]:
    """How many alerts of each kind are in each state (every pair present, zeros included)."""
    found = {
        (kind, state): count
        for kind, state, count in session.execute(select(Alert.kind, Alert.state, func.count()).group_by(Alert.kind, Alert.state))
    }
    return {(kind, state): found.get((kind, state), 0) for kind in AlertKind for state in AlertState}
