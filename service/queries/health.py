"""A target's health beside its test results: its configuration error and its pollers' last outcome.

One answer for ``GET /targets``, the dashboard's overview and target page: the open CONFIGURATION alert (the
target's repository cannot be used; see :mod:`workers.analysis.configuration`) with its cause, and per poll
state (a watched branch, or the releases) when it was last polled, when it last succeeded and its error.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Alert, AlertKind, AlertState, PollState


@dataclass(frozen=True)
class PollHealth:
    kind: str  # branch | releases
    ref: str
    polled_at: datetime | None
    succeeded_at: datetime | None
    error: str | None


@dataclass(frozen=True)
class TargetHealth:
    """``configuration_error``: the cause of the open configuration alert (None: none open)."""

    configuration_alert_id: int | None = None
    configuration_error: str | None = None
    configuration_since: datetime | None = None
    polls: tuple[PollHealth, ...] = ()

    @property
    def poll_errors(self) -> tuple[PollHealth, ...]:
        return tuple(p for p in self.polls if p.error)

    @property
    def last_polled_at(self) -> datetime | None:
        return max((p.polled_at for p in self.polls if p.polled_at is not None), default=None)


def targets_health(session: Session, target_ids: Iterable[int]) -> dict[int, TargetHealth]:
    """The health of each of ``target_ids`` (every id present; a healthy target's is empty)."""
    ids = sorted(set(target_ids))
    alerts: dict[int, Alert] = {}
    query = (
        select(Alert)
        .where(Alert.target_id.in_(ids), Alert.kind == AlertKind.configuration, Alert.state != AlertState.resolved)
        .order_by(Alert.id)
    )
    for alert in session.scalars(query):
        alerts.setdefault(alert.target_id, alert)
    polls: dict[int, list[PollHealth]] = {}
    for state in session.scalars(select(PollState).where(PollState.target_id.in_(ids)).order_by(PollState.kind, PollState.ref)):
        polls.setdefault(state.target_id, []).append(
            PollHealth(state.kind.value, state.ref, state.polled_at, state.succeeded_at, state.error)
        )
    health = {}
    for target_id in ids:
        standing = alerts.get(target_id)
        cause = next((str(e.get("error")) for e in standing.cases if e.get("error")), standing.summary) if standing else None
        health[target_id] = TargetHealth(
            configuration_alert_id=standing.id if standing else None,
            configuration_error=cause,
            configuration_since=standing.created_at if standing else None,
            polls=tuple(polls.get(target_id, ())),
        )
    return health
