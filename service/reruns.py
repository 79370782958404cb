"""Re-running a commit by hand (``specwatch rerun``, ``POST /targets/{name}/commits/{sha}/rerun``, the dashboard's
button): a new primary run of the commit, with the reason and who asked recorded on it.

A re-run repeats the test: the same profile and the commit's own seeds (``seed_attempt`` 0), so it cannot draw
new luck for a statistical failure (confirmation runs do that, with fresh seeds, and only on an alarm). What it is
for: a run that ended in error for a reason outside the commit (a worker lost, a sandbox or configuration fixed
since), a commit whose run was cancelled, or a changed environment (a new torch, a new suite). Its analysis is a
primary run's (verdict, confirmation, alerts, commit status); the timeline shows the commit's latest run, so the
re-run takes the commit's place there, with its reason.

A commit whose run of the profile is still queued or running is not queued twice (:class:`RerunError`). Like
every run, it is sent to the workers only after the unit of work that made it commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.ingest import RunOptions
from service.models import Commit, Run, RunPurpose, RunStatus
from service.notifications.statuses import queue_status
from service.queries.common import QueryError, get_target
from service.queries.compare import resolve_sha
from service.textlimits import cut

#: The most characters kept of a reason (the rest is cut with a marker).
REASON_MAX = 2000
RERUN_BY_MAX = 100


class RerunError(QueryError):
    """The commit cannot be re-run as asked (no reason given)."""


class RunBusyError(RerunError):
    """A run of the commit (same profile) is still queued or running: it is not queued twice."""


@dataclass(frozen=True)
class Rerun:
    run_id: int
    target: str
    sha: str
    reason: str
    requested_by: str


def rerun_commit(
    session: Session, target_name: str, sha: str, *, reason: str, requested_by: str, options: RunOptions, due_now: bool = False
) -> Rerun:
    """Queue a new primary run of ``target_name``'s commit ``sha`` (or a unique prefix) with ``reason``; flushed, not
    committed: the caller enqueues the run id once its unit of work has committed.

    ``due_now``: for a caller that cannot reach the workers' broker (the command line beside ``specwatch serve``,
    whose queue lives in the server's process): the run's lease is already over, so the workers' sweeper sends it
    at its next pass (``SPECWATCH_WORKER_SWEEP_INTERVAL_S``, a minute by default).

    :class:`~service.queries.NotFoundError` without such a target or commit; :class:`RerunError` without a reason,
    :class:`RunBusyError` while a run of the commit (same profile) is queued or running.
    """
    reason = " ".join(reason.split())
    if not reason:
        raise RerunError("give a reason for the re-run (it is recorded with the run and shown on the timeline)")
    target = get_target(session, target_name)
    commit: Commit = resolve_sha(session, target, sha)
    busy = session.scalars(
        select(Run.id).where(
            Run.commit_id == commit.id, Run.profile == options.profile, Run.status.in_([RunStatus.queued, RunStatus.running])
        )
    ).first()
    if busy is not None:
        raise RunBusyError(f"run {busy} of commit {commit.sha[:12]} is still queued or running: wait for it to finish")
    now = datetime.now(UTC)
    lease = now if due_now else now + options.queued_lease
    run = Run(
        commit=commit,
        profile=options.profile,
        status=RunStatus.queued,
        purpose=RunPurpose.primary,
        lease_expires_at=lease,
        rerun_reason=cut(reason, REASON_MAX),
        rerun_by=cut(requested_by, RERUN_BY_MAX),
    )
    session.add(run)
    session.flush()
    if options.status_dashboard_url is not None:
        queue_status(session, run, commit, "pending", options.status_dashboard_url)
    return Rerun(run_id=run.id, target=target.name, sha=commit.sha, reason=run.rerun_reason or reason, requested_by=run.rerun_by or "")
