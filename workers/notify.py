"""The notification outbox: Slack messages (Block Kit) and GitHub commit statuses, written now, sent later.

Writers (:func:`queue_alert_message`, :func:`queue_commit_status`) add a ``notifications`` row in the caller's
transaction, with the whole payload and a unique ``dedup_key``; nothing is sent there. The sender
(:func:`deliver_due`, the task ``workers.deliver_notifications``) takes one due row at a time under
``SELECT .. FOR UPDATE SKIP LOCKED`` (two senders never send the same row), sends it and records the result
in the same short transaction. A run's commit statuses (and check runs) go out in the order they were written: a
row waits while an older one of its run is being sent, and an older one taken after a newer exists is never sent
(``superseded``):

- 2xx: ``sent``;
- HTTP 429: still ``pending``, next try after ``Retry-After`` (never slept on in the task);
- 5xx or a network error: ``failed``, next try after an exponential backoff capped at ``backoff_max_s``;
  after ``max_attempts`` tries ``next_attempt_at`` is cleared (given up, visible in the table);
- another 4xx (bad payload, revoked hook): ``failed`` with no next try (retrying cannot help).

Secrets (the Slack webhook URL, the GitHub token) are read from settings when sending, never stored in a
payload, never logged: error texts are scrubbed of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.models import Notification, NotificationChannel, NotificationStatus
from workers.senders import SENDERS, Channels

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- sending
@dataclass(frozen=True)
class DeliveryReport:
    sent: list[int]
    deferred: list[int]  # 429: pending until Retry-After
    failed: list[int]  # will be retried
    given_up: list[int]

    def as_dict(self) -> dict[str, list[int]]:
        return {"sent": self.sent, "deferred": self.deferred, "failed": self.failed, "given_up": self.given_up}


def _due(now: datetime) -> ColumnElement[bool]:
    """Pending rows not deferred past ``now``, and failed rows whose retry is due (a given-up row has none)."""
    return or_(
        and_(
            Notification.status == NotificationStatus.pending,
            or_(Notification.next_attempt_at.is_(None), Notification.next_attempt_at <= now),
        ),
        and_(Notification.status == NotificationStatus.failed, Notification.next_attempt_at <= now),
    )


def _superseded(session: Session, row: Notification) -> bool:
    """A commit status (or check run) with a newer one for the same run (GitHub shows the last one posted)."""
    if row.channel not in (NotificationChannel.github, NotificationChannel.github_check) or row.run_id is None:
        return False
    newer = select(Notification.id).where(Notification.channel == row.channel, Notification.run_id == row.run_id, Notification.id > row.id)
    return session.scalars(newer.limit(1)).first() is not None


def _older_in_flight(session: Session, row: Notification) -> bool:
    """Whether an older commit status (or check run) of ``row``'s run is being sent by another sender now (its row
    locked): then ``row`` waits, so that a run's statuses reach GitHub in the order they were written (two senders
    could otherwise post an older one after a newer). The older rows not in flight stay locked by this
    transaction until ``row`` is recorded, so none of them starts meanwhile (it is superseded when taken)."""
    if row.channel not in (NotificationChannel.github, NotificationChannel.github_check) or row.run_id is None:
        return False
    older = select(Notification.id).where(Notification.channel == row.channel, Notification.run_id == row.run_id, Notification.id < row.id)
    every = set(session.scalars(older))
    free = set(session.scalars(older.with_for_update(skip_locked=True)))
    return free != every


def deliver_due(factory: sessionmaker[Session], channels: Channels, *, now: Callable[[], datetime], limit: int) -> DeliveryReport:
    """Send up to ``limit`` due notifications, oldest first, one transaction per row (see the module docstring)."""
    sent: list[int] = []
    deferred: list[int] = []
    failed: list[int] = []
    given_up: list[int] = []
    skipped: set[int] = set()
    for _ in range(limit):
        with session_scope(factory) as session:
            moment = now()
            row = session.scalars(
                select(Notification)
                .where(_due(moment), Notification.id.not_in(skipped) if skipped else Notification.id.is_not(None))
                .order_by(Notification.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                break
            skipped.add(row.id)
            if _older_in_flight(session, row):  # sent on a later pass, after the older one
                continue
            if _superseded(session, row):  # a stale pending must never overwrite a newer failure
                row.status, row.next_attempt_at, row.last_error = NotificationStatus.failed, None, "superseded by a newer commit status"
                given_up.append(row.id)
                continue
            result = SENDERS[row.channel](row.payload, channels)
            row.attempts += 1
            if result.ok:
                row.status = NotificationStatus.sent
                row.sent_at = moment
                row.next_attempt_at = None
                row.last_error = None
                sent.append(row.id)
            elif result.retry_after_s is not None:
                row.status = NotificationStatus.pending
                row.next_attempt_at = moment + timedelta(seconds=result.retry_after_s)
                row.last_error = result.error
                deferred.append(row.id)
            else:
                row.status = NotificationStatus.failed
                row.last_error = result.error
                if result.retryable and row.attempts < channels.max_attempts:
                    delay = min(channels.backoff_s * 2 ** (row.attempts - 1), channels.backoff_max_s)
                    row.next_attempt_at = moment + timedelta(seconds=delay)
                    failed.append(row.id)
                else:
                    row.next_attempt_at = None
                    given_up.append(row.id)
            log.info(
                "notification_delivery id=%s channel=%s event=%s status=%s attempts=%s next=%s error=%s",
                row.id,
                row.channel.value,
                row.event,
                row.status.value,
                row.attempts,
                row.next_attempt_at,
                row.last_error,
            )
    return DeliveryReport(sent=sent, deferred=deferred, failed=failed, given_up=given_up)
