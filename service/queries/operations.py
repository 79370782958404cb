"""What an operator watches, read from the database for ``/metrics`` (:mod:`service.routes.ops`): the queue and its
age per target, the notification outbox's backlog, the pollers' errors, run and case durations, and the runs and
cases that failed, by kind.

The database is the record of all of it (the workers run in other processes, and a scrape reaches only the API):
each answer is one aggregate query, so a scrape costs a few index or table scans whatever the history's length.
Durations are cumulative histograms over every finished run and every case result stored (buckets counted by the
database), the shape Prometheus expects of a histogram.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Float, and_, case, cast, extract, func, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from service.models import (
    CaseResult,
    Commit,
    Notification,
    NotificationChannel,
    NotificationStatus,
    PollState,
    Run,
    RunStatus,
    Target,
    Verdict,
)

#: A column or an expression over columns.
SQLExpr = ColumnElement[Any] | InstrumentedAttribute[Any]

#: Upper bounds of the run-duration buckets, in seconds (a smoke run takes seconds, a full profile on CPU an hour).
RUN_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0)
#: Upper bounds of the case-duration buckets, in seconds.
CASE_BUCKETS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass(frozen=True)
class Histogram:
    """Cumulative counts per upper bound (the last is +Inf: every observation), their sum and count."""

    buckets: tuple[tuple[float, int], ...]
    total: float
    count: int


@dataclass(frozen=True)
class QueueState:
    target: str
    queued: int
    running: int
    oldest_queued_at: datetime | None


@dataclass(frozen=True)
class PollStatus:
    target: str
    kind: str
    ref: str
    failing: bool
    polled_at: datetime | None
    succeeded_at: datetime | None


def _aware(moment: datetime | str | None) -> datetime | None:
    """An aggregate's datetime as aware UTC (SQLite's ``min`` gives text back, without a zone)."""
    if moment is None:
        return None
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def queues(session: Session) -> list[QueueState]:
    """Per target (every target, by name): its runs waiting for a worker, running, and the oldest waiting's queue time."""
    rows = session.execute(
        select(Target.name, Run.status, func.count(Run.id), func.min(Run.queued_at))
        .join(Commit, Commit.target_id == Target.id)
        .join(Run, Run.commit_id == Commit.id)
        .where(Run.status.in_([RunStatus.queued, RunStatus.running]))
        .group_by(Target.name, Run.status)
    )
    found: dict[str, tuple[int, int, datetime | None]] = dict.fromkeys(session.scalars(select(Target.name)), (0, 0, None))
    for name, status, count, oldest in rows:
        queued, running, since = found[name]
        found[name] = (count, running, _aware(oldest)) if status is RunStatus.queued else (queued, count, since)
    return [QueueState(name, *found[name]) for name in sorted(found)]


def outbox_backlog(session: Session, now: datetime) -> tuple[dict[tuple[str, str], int], datetime | None]:
    """The notifications not sent, by (channel, state): ``due`` (to send now), ``deferred`` (a 429's Retry-After or a
    backoff not over), ``given_up`` (no next try); and when the oldest row still to send was written."""
    state = case(
        (and_(Notification.status == NotificationStatus.failed, Notification.next_attempt_at.is_(None)), "given_up"),
        (and_(Notification.next_attempt_at.is_not(None), Notification.next_attempt_at > now), "deferred"),
        else_="due",
    )
    unsent = Notification.status != NotificationStatus.sent
    counts = {(channel.value, kind): 0 for channel in NotificationChannel for kind in ("due", "deferred", "given_up")}
    rows = session.execute(select(Notification.channel, state, func.count()).where(unsent).group_by(Notification.channel, state))
    for channel, kind, count in rows:
        counts[(channel.value, str(kind))] = count
    live = and_(unsent, or_(Notification.status == NotificationStatus.pending, Notification.next_attempt_at.is_not(None)))
    oldest = session.scalar(select(func.min(Notification.created_at)).where(live))
    return counts, _aware(oldest)


def polls(session: Session) -> list[PollStatus]:
    """Every poll state (a target's watched branch, or its releases): whether its last poll failed, and when it last
    polled and succeeded."""
    rows = session.execute(select(Target.name, PollState).join(PollState, PollState.target_id == Target.id).order_by(Target.name))
    return [
        PollStatus(name, state.kind.value, state.ref, state.error is not None, state.polled_at, state.succeeded_at) for name, state in rows
    ]


def _seconds_between(session: Session, start: SQLExpr, end: SQLExpr) -> ColumnElement[Any]:
    """``end - start`` in seconds, in the session's SQL dialect."""
    if session.get_bind().dialect.name == "sqlite":
        return (func.julianday(end) - func.julianday(start)) * 86400.0
    return extract("epoch", end - start)


def _histogram(session: Session, value: SQLExpr, where: Sequence[ColumnElement[bool]], bounds: Sequence[float]) -> Histogram:
    measured = cast(value, Float)
    columns = [func.sum(case((measured <= bound, 1), else_=0)) for bound in bounds]
    row = session.execute(select(*columns, func.sum(measured), func.count()).where(*where, value.is_not(None))).one()
    counts = [int(c or 0) for c in row[: len(bounds)]]
    total, count = float(row[len(bounds)] or 0.0), int(row[len(bounds) + 1] or 0)
    return Histogram(buckets=(*zip(bounds, counts, strict=True), (float("inf"), count)), total=total, count=count)


def run_durations(session: Session) -> dict[str, Histogram]:
    """Per finished status (passed, failed, error, uninstallable): how long its runs took over every attempt (the
    last one's claim to finish, and ``earlier_attempts_s``: each earlier one's claim to its end or last heartbeat)."""
    seconds = _seconds_between(session, Run.started_at, Run.finished_at) + Run.earlier_attempts_s
    found = {}
    for status in (RunStatus.passed, RunStatus.failed, RunStatus.error, RunStatus.uninstallable):
        found[status.value] = _histogram(session, seconds, [Run.status == status, Run.started_at.is_not(None)], RUN_BUCKETS)
    return found


def case_durations(session: Session) -> Histogram:
    """How long each stored case result took (the suite's ``duration_s``)."""
    return _histogram(session, CaseResult.duration_s, [], CASE_BUCKETS)


def run_failures(session: Session) -> dict[str, int]:
    """Finished runs that did not pass, by kind: ``violation`` (a case failed), ``broken`` (the suite could not run the
    commit's code), ``configuration`` (the target's repository could not be used), ``infrastructure`` (not the commit's
    code: the commit missing, a checkout failure, the worker crashed or lost), ``uninstallable`` (never installed), and
    ``install_retries`` (attempts that could not install and were retried, whatever the run's end)."""
    kind = case(
        (Run.configuration_error.is_(True), "configuration"),
        (Run.infrastructure_error.is_(True), "infrastructure"),
        (Run.status == RunStatus.failed, "violation"),
        (Run.status == RunStatus.error, "broken"),
        else_="uninstallable",
    )
    failed = Run.status.in_([RunStatus.failed, RunStatus.error, RunStatus.uninstallable])
    found = dict.fromkeys(("violation", "broken", "configuration", "infrastructure", "uninstallable"), 0)
    for name, count in session.execute(select(kind, func.count()).where(failed).group_by(kind)):
        found[str(name)] = count
    found["install_retries"] = int(session.scalar(select(func.coalesce(func.sum(Run.install_failures), 0))) or 0)
    return found


def case_failures(session: Session) -> dict[str, int]:
    """Failing and erroring case results, by kind: ``lossless`` (the emitted tokens refuted the target law),
    ``conformance`` (lossless, the acceptance behaviour refuted), ``raised`` (the sampler raised on a valid input),
    ``error`` (the case could not run)."""
    kind = case(
        (CaseResult.verdict == Verdict.ERROR, "error"),
        (CaseResult.lossless.is_(False), "lossless"),
        (CaseResult.conformance.is_(False), "conformance"),
        else_="raised",
    )
    found = dict.fromkeys(("lossless", "conformance", "raised", "error"), 0)
    rows = session.execute(select(kind, func.count()).where(CaseResult.verdict.in_([Verdict.FAIL, Verdict.ERROR])).group_by(kind))
    for name, count in rows:
        found[str(name)] = count
    return found
