"""The branch poller: new commits on the watched branches of source-installed targets become queued runs.

It asks the remote for the branches' heads (``git ls-remote``), reads the new commits from the target's
mirror (:class:`workers.checkout.MirrorCache`) with no transaction open, then records them per branch in one
transaction; see :mod:`workers.pollers` for what a first poll and a forced push record.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from service.after_commit import after_commit
from service.db import session_scope
from service.ingest import NewCommit, Recorded, RunOptions, lock_targets, record_and_queue
from service.models import PollKind
from workers.checkout import CheckoutError, GitCommit, MirrorCache
from workers.pollers.claims import Enqueue, PollJob, PollReport, claim_due, record_failure, record_success, utcnow

log = logging.getLogger(__name__)

AUTHOR_MAX = 255


def _described(commit: GitCommit) -> NewCommit:
    return NewCommit(
        sha=commit.sha,
        parents=commit.parents,
        author=commit.author[:AUTHOR_MAX],
        committed_at=commit.committed_at,
        message=commit.message,
    )


def poll_branches(
    factory: sessionmaker[Session],
    *,
    mirrors: MirrorCache,
    options: RunOptions,
    enqueue: Enqueue,
    now: datetime | None = None,
    timeout_s: float = 60,
) -> PollReport:
    """Poll the watched branches of every due source target; see the module docstring. Raises only for
    infrastructure errors (the database); a remote's problems are recorded on its poll states."""
    with session_scope(factory) as session:
        jobs = claim_due(session, PollKind.branch, now=now or utcnow())
    report = PollReport()
    for job in jobs:
        report.polled.append(job.target_name)
        try:
            remote = mirrors.ls_remote(job.repo_url, list(job.heads), timeout=timeout_s)
        except CheckoutError as exc:
            log.warning("poll_unreachable target=%s repo=%s error=%s", job.target_name, job.repo_url, exc)
            record_failure(factory, job, PollKind.branch, list(job.heads), f"remote unreachable: {exc}")
            report.errors.update({f"{job.target_name}/{branch}": str(exc) for branch in job.heads})
            continue
        for branch, old in job.heads.items():
            moved = (old, remote.get(branch))
            error = _poll_branch(factory, job, branch, moved, mirrors=mirrors, options=options, enqueue=enqueue, report=report)
            if error is not None:
                report.errors[f"{job.target_name}/{branch}"] = error
    return report


def _poll_branch(
    factory: sessionmaker[Session],
    job: PollJob,
    branch: str,
    moved: tuple[str | None, str | None],
    *,
    mirrors: MirrorCache,
    options: RunOptions,
    enqueue: Enqueue,
    report: PollReport,
) -> str | None:
    """Record what moved on one branch (its ``(old, new)`` heads); the error, if the branch could not be read."""
    old, new = moved
    if new is None:
        error = f"branch {branch} does not exist on {job.repo_url}"
        log.warning("poll_branch_missing target=%s branch=%s", job.target_name, branch)
        record_failure(factory, job, PollKind.branch, [branch], error)
        return error
    if new == old:
        with session_scope(factory) as session:
            record_success(session, job, PollKind.branch, branch, head=new, note=None)
        return None
    try:
        mirrors.fetch(job.repo_url, new)
        forced = old is not None and not mirrors.is_ancestor(job.repo_url, old, new)
        commits = mirrors.first_parent_log(job.repo_url, new, None if forced else old)
    except CheckoutError as exc:
        log.warning("poll_fetch_failed target=%s branch=%s head=%s error=%s", job.target_name, branch, new, exc)
        record_failure(factory, job, PollKind.branch, [branch], f"fetch failed: {exc}")
        return str(exc)
    with session_scope(factory) as session:
        targets = lock_targets(session, [job.target_id])
        if not targets or branch not in targets[0].branches:
            return None
        recorded = record_and_queue(session, targets[0], branch, [_described(c) for c in commits], head=new, options=options)
        note = _branch_note(branch, old, new, forced, recorded)
        record_success(session, job, PollKind.branch, branch, head=new, note=note)
        if recorded.run_ids:
            after_commit(session, enqueue, recorded.run_ids)
    log.info(
        "poll_branch_moved target=%s branch=%s old=%s new=%s forced=%s commits=%s runs=%s",
        job.target_name,
        branch,
        old,
        new,
        forced,
        recorded.new_commits,
        recorded.run_ids,
    )
    if forced:
        log.warning("poll_forced_push target=%s branch=%s old=%s new=%s: recorded the new head only", job.target_name, branch, old, new)
    report.run_ids += recorded.run_ids
    return None


def _branch_note(branch: str, old: str | None, new: str, forced: bool, recorded: Recorded) -> str:
    if old is None:
        what = f"first poll of {branch}: head {new[:12]} recorded"
    elif forced:
        what = f"forced push on {branch}: {old[:12]} is not an ancestor of {new[:12]}; recorded the new head only"
    else:
        what = f"{branch} {old[:12]}..{new[:12]}"
    return f"{what}; {recorded.new_commits} new commit(s), {len(recorded.run_ids)} run(s) queued"
