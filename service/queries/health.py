"""A target's health beside its test results: its configuration error, its pollers' last outcome, its queue and
its last run.

One answer for ``GET /targets``, ``specwatch targets list`` and the dashboard's target page: the open CONFIGURATION
alert (the target's repository cannot be used; see :mod:`workers.analysis.configuration`) with its cause; per poll
state (a watched branch, or the releases) when it was last polled, when it last succeeded and its error; how many
of its runs wait (queued) or run, and since when the oldest waits; and its last finished run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import FINISHED_STATUSES, Alert, AlertKind, AlertState, Commit, PollState, Run, RunStatus


@dataclass(frozen=True)
class PollHealth:
    kind: str  # branch | releases
    ref: str
    polled_at: datetime | None
    succeeded_at: datetime | None
    error: str | None


@dataclass(frozen=True)
class LastRun:
    """A target's last finished run (by when it finished)."""

    id: int
    sha: str
    status: RunStatus
    finished_at: datetime | None
    error: str | None


@dataclass(frozen=True)
class TargetHealth:
    """``configuration_error``: the cause of the open configuration alert (None: none open). ``queued_runs`` wait
    for a worker, the oldest since ``oldest_queued_at`` (its queue age); ``running_runs`` hold one now."""

    configuration_alert_id: int | None = None
    configuration_error: str | None = None
    configuration_since: datetime | None = None
    polls: tuple[PollHealth, ...] = ()
    queued_runs: int = 0
    running_runs: int = 0
    oldest_queued_at: datetime | None = None
    last_run: LastRun | None = None

    def queue_age_s(self, now: datetime) -> float | None:
        """How long the oldest queued run has waited, in seconds (None: none waits)."""
        return None if self.oldest_queued_at is None else max(0.0, (now - self.oldest_queued_at).total_seconds())

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
    queue = _queues(session, ids)
    last = _last_runs(session, ids)
    health = {}
    for target_id in ids:
        standing = alerts.get(target_id)
        cause = next((str(e.get("error")) for e in standing.cases if e.get("error")), standing.summary) if standing else None
        queued, running, oldest = queue.get(target_id, (0, 0, None))
        health[target_id] = TargetHealth(
            configuration_alert_id=standing.id if standing else None,
            configuration_error=cause,
            configuration_since=standing.created_at if standing else None,
            polls=tuple(polls.get(target_id, ())),
            queued_runs=queued,
            running_runs=running,
            oldest_queued_at=oldest,
            last_run=last.get(target_id),
        )
    return health


def _queues(session: Session, ids: list[int]) -> dict[int, tuple[int, int, datetime | None]]:
    """Per target: its queued runs, its running runs, and when the oldest queued run was queued."""
    found: dict[int, tuple[int, int, datetime | None]] = {}
    rows = session.execute(
        select(Commit.target_id, Run.status, func.count(), func.min(Run.queued_at))
        .join(Run.commit)
        .where(Commit.target_id.in_(ids), Run.status.in_([RunStatus.queued, RunStatus.running]))
        .group_by(Commit.target_id, Run.status)
    )
    for target_id, status, count, oldest in rows:
        queued, running, since = found.get(target_id, (0, 0, None))
        if status is RunStatus.queued:
            found[target_id] = (count, running, _aware(oldest))
        else:
            found[target_id] = (queued, count, since)
    return found


def _aware(moment: datetime | None) -> datetime | None:
    """An aggregate's datetime (SQLite gives it back naive and as text through ``min``) as aware UTC."""
    if moment is None:
        return None
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _last_runs(session: Session, ids: list[int]) -> dict[int, LastRun]:
    """Per target: its last finished run (the newest ``finished_at``, then the highest id)."""
    ranked = (
        select(
            Run.id,
            Commit.target_id,
            func.row_number()
            .over(partition_by=Commit.target_id, order_by=(Run.finished_at.desc().nulls_last(), Run.id.desc()))
            .label("rank"),
        )
        .join(Run.commit)
        .where(Commit.target_id.in_(ids), Run.status.in_(list(FINISHED_STATUSES)))
        .subquery()
    )
    rows = session.execute(
        select(ranked.c.target_id, Run, Commit.sha).join(Run, Run.id == ranked.c.id).join(Run.commit).where(ranked.c.rank == 1)
    )
    return {target_id: LastRun(run.id, sha, run.status, run.finished_at, run.error) for target_id, run, sha in rows}
