"""Alerts (a confirmed finding about a first bad commit) and the notification outbox that carries them."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, UniqueConstraint, func
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.models.base import Base, UTCDateTime, enum_column
from service.models.entries import AlertEntry
from service.models.targets import Commit, Target


class AlertKind(enum.StrEnum):
    violation = "violation"  # losslessness fails: emitted tokens do not follow the target law
    performance = "performance"  # lossless, but the acceptance behaviour changed
    broken = "broken"  # the commit does not import or crashes the suite
    exception = "exception"  # the sampler raised on a valid input: a finding about the sampler
    uninstallable = "uninstallable"  # could not install (a missing dependency, the index unreachable), persistently
    configuration = "configuration"  # the target's repository cannot be used: one alert per target, not per commit


class AlertState(enum.StrEnum):
    open = "open"
    acknowledged = "acknowledged"
    resolved = "resolved"


class NotificationChannel(enum.StrEnum):
    slack = "slack"
    github = "github"  # a commit status
    github_check = "github_check"  # a check run (targets with ``github_checks``): the run's report


class NotificationStatus(enum.StrEnum):
    pending = "pending"  # not sent yet (first try, or rescheduled after a 429 Retry-After)
    sent = "sent"
    failed = "failed"  # the last try failed; retried at next_attempt_at (None: given up, see last_error)


class Alert(Base):
    """A confirmed finding: one per (target, branch, first bad commit, kind), grouping its failing cases.

    ``branch`` is the commit's branch, or :data:`RELEASES_BRANCH` for release commits (a unique key must not
    hold NULL, which PostgreSQL treats as distinct). ``cases`` lists the failing cases as found, each a dict
    with ``case_id``, ``reason`` (lossless, conformance, drift, exception, broken or uninstallable), ``e_value``, ``log_e_value``,
    ``threshold``, ``tv_estimate``, ``acceptance_observed``, ``acceptance_expected`` and, when confirmed,
    ``confirmation_log_e_value``.
    """

    __tablename__ = "alerts"
    __table_args__ = (
        UniqueConstraint("target_id", "branch", "first_bad_commit_id", "kind"),
        Index(None, "target_id", "branch", "state"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    branch: Mapped[str] = mapped_column(String(255))
    first_bad_commit_id: Mapped[int] = mapped_column(ForeignKey("commits.id", ondelete="CASCADE"))
    kind: Mapped[AlertKind] = mapped_column(enum_column(AlertKind, "alert_kind"))
    state: Mapped[AlertState] = mapped_column(enum_column(AlertState, "alert_state"), default=AlertState.open)
    # The run that found it, its confirmation (None: confirmation off, or not needed), the last good commit.
    detected_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    confirmation_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    last_good_commit_id: Mapped[int | None] = mapped_column(ForeignKey("commits.id", ondelete="SET NULL"))
    confirmed: Mapped[bool] = mapped_column(default=False)
    # Runs spent finding the first bad commit (bisection runs, not counting the confirmation).
    bisection_runs: Mapped[int] = mapped_column(Integer, default=0)
    # Entries of a tagged union (service.models.entries); read them with alert_entries(), which checks them.
    cases: Mapped[list[AlertEntry]] = mapped_column(JSON, default=list)
    summary: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())
    acknowledged_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    resolved_by_commit_id: Mapped[int | None] = mapped_column(ForeignKey("commits.id", ondelete="SET NULL"))
    # How often it failed again after being resolved, and when it last did (reopened with a notification,
    # never merged quietly into the resolved alert).
    reopened_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    reopened_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    target: Mapped[Target] = relationship()
    first_bad_commit: Mapped[Commit] = relationship(foreign_keys=[first_bad_commit_id])


#: The ``alerts.branch`` of release commits (which are on no branch).
RELEASES_BRANCH = "(releases)"


class Notification(Base):
    """The outbox: one message to send (a Slack alert or resolve message, a GitHub commit status).

    Written in the transaction that decided it, sent later by ``workers.deliver_notifications``; the row keeps
    its status, tries and last error, so nothing is lost when the receiver is down. ``dedup_key`` makes
    writing it idempotent (``alert:12:opened:slack``, ``status:run:40:pending``).
    """

    __tablename__ = "notifications"
    __table_args__ = (Index(None, "status", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    dedup_key: Mapped[str] = mapped_column(String(200), unique=True)
    alert_id: Mapped[int | None] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    channel: Mapped[NotificationChannel] = mapped_column(enum_column(NotificationChannel, "notification_channel"))
    event: Mapped[str] = mapped_column(String(50))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[NotificationStatus] = mapped_column(
        enum_column(NotificationStatus, "notification_status"), default=NotificationStatus.pending
    )
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
