"""Targets and what arrives for them: watched libraries, their commits, the pollers' state and GitHub deliveries."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, UniqueConstraint, false, func
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.models.base import Base, UTCDateTime, enum_column

if TYPE_CHECKING:
    from service.models.runs import Run


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


class Target(Base):
    """A watched library: where its code lives, which adapter tests it, how it is installed and polled."""

    __tablename__ = "targets"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    repo_url: Mapped[str] = mapped_column(String(500))
    adapter: Mapped[str] = mapped_column(String(100))
    install_mode: Mapped[InstallMode] = mapped_column(enum_column(InstallMode, "install_mode"), default=InstallMode.source)
    branches: Mapped[list[str]] = mapped_column(JSON, default=list)
    # None: not polled (webhook only); a pip-installed target's releases are then polled at the pollers' default.
    poll_interval_s: Mapped[int | None] = mapped_column(Integer)
    commit_policy: Mapped[CommitPolicy] = mapped_column(enum_column(CommitPolicy, "commit_policy"), default=CommitPolicy.head)
    # Opt-in: besides the commit status, a GitHub check run carrying the run's report (failing cases, known
    # findings, the command that reproduces it).
    github_checks: Mapped[bool] = mapped_column(default=False, server_default=false())
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
    kind: Mapped[PollKind] = mapped_column(enum_column(PollKind, "poll_kind"))
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
    status: Mapped[DeliveryStatus] = mapped_column(enum_column(DeliveryStatus, "delivery_status"))
    reason: Mapped[str | None] = mapped_column(Text)
    # What a push moved (None for other events): the ref, its old and new head, and whether it was forced
    # (history rewritten: commits recorded before may no longer be on the branch).
    ref: Mapped[str | None] = mapped_column(String(255))
    before_sha: Mapped[str | None] = mapped_column(String(64))
    after_sha: Mapped[str | None] = mapped_column(String(64))
    forced: Mapped[bool | None]
