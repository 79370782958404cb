"""What both pollers share: claiming the due targets' poll states, and keeping what a poll found or why it failed.

See :mod:`workers.pollers` for the three steps of a poll (claim, look, record).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db import insert_ignoring_conflicts, session_scope
from service.models import Commit, InstallMode, PollKind, PollState, Target

ERROR_MAX = 2000

#: Called with the ids of queued runs once the transaction that queued them has committed (registered with
#: :func:`service.after_commit.after_commit`; ``service.queue.enqueue_runs`` in the tasks).
Enqueue = Callable[[list[int]], object]


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class PollJob:
    """A claimed target: what to ask the remote or the index, and the heads known before asking."""

    target_id: int
    target_name: str
    repo_url: str
    # Branch (or package) → the last recorded head (None: never seen).
    heads: dict[str, str | None]


@dataclass
class PollReport:
    """What one poller run did: the targets it polled, the runs it queued, what failed (``target/ref``)."""

    polled: list[str] = field(default_factory=list)
    run_ids: list[int] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"polled": self.polled, "runs": self.run_ids, "errors": self.errors}


# --- claim ---------------------------------------------------------------------------------------------


#: The package on the index whose releases a pip-installed target tests, from (target name, adapter).
PackageOf = Callable[[str, str], str]


def default_package(name: str, adapter: str) -> str:
    """The package of a target by default: the target's name."""
    return name


def _polled_refs(target: Target, kind: PollKind, package_of: PackageOf = default_package) -> list[str]:
    return list(target.branches) if kind is PollKind.branch else [package_of(target.name, target.adapter)]


def _due_targets(session: Session, kind: PollKind, release_interval_s: int) -> list[tuple[Target, int]]:
    """The targets ``kind`` polls, with their poll interval in seconds."""
    if kind is PollKind.branch:
        query = select(Target).where(Target.install_mode == InstallMode.source, Target.poll_interval_s.is_not(None))
    else:
        query = select(Target).where(Target.install_mode == InstallMode.pip)
    return [(t, t.poll_interval_s or release_interval_s) for t in session.scalars(query.order_by(Target.id))]


def _insert_missing_states(session: Session, rows: list[dict[str, Any]]) -> None:
    """A poll state per (target, kind, ref) that has none: ``INSERT .. ON CONFLICT DO NOTHING`` (a concurrent
    poller may insert the same rows)."""
    statement = insert_ignoring_conflicts(session, PollState, rows, [PollState.target_id, PollState.kind, PollState.ref])
    if statement is not None:
        session.execute(statement)
        return
    existing = {(s.target_id, s.kind, s.ref) for s in session.scalars(select(PollState))}
    session.add_all(PollState(**row) for row in rows if (row["target_id"], row["kind"], row["ref"]) not in existing)
    session.flush()


def _last_recorded(session: Session, target_id: int, branch: str) -> str | None:
    """The branch's last recorded commit (from webhooks, before polling was turned on), if any."""
    query = select(Commit.sha).where(Commit.target_id == target_id, Commit.branch == branch).order_by(Commit.branch_order.desc()).limit(1)
    return session.scalar(query)


def claim_due(
    session: Session, kind: PollKind, *, now: datetime, release_interval_s: int = 3600, package_of: PackageOf = default_package
) -> list[PollJob]:
    """Claim the targets due for a ``kind`` poll at ``now``: their states are stamped ``polled_at = now``.

    A target is due when one of its watched branches (or its package) was never polled or was last polled at
    least its poll interval ago. States locked by a concurrent poller are skipped. Flushed, not committed:
    commit before polling, so the claim is visible to other pollers.
    """
    targets = _due_targets(session, kind, release_interval_s)
    if not targets:
        return []
    rows = [{"target_id": t.id, "kind": kind, "ref": ref} for t, _ in targets for ref in _polled_refs(t, kind, package_of)]
    if rows:
        _insert_missing_states(session, rows)
    states = session.scalars(
        select(PollState)
        .where(PollState.target_id.in_([t.id for t, _ in targets]), PollState.kind == kind)
        .order_by(PollState.id)
        .with_for_update(skip_locked=True)
    ).all()
    jobs: list[PollJob] = []
    for target, interval_s in targets:
        refs = _polled_refs(target, kind, package_of)
        held = {s.ref: s for s in states if s.target_id == target.id and s.ref in refs}
        cutoff = now - timedelta(seconds=interval_s)
        if not any(s.polled_at is None or s.polled_at <= cutoff for s in held.values()):
            continue
        heads: dict[str, str | None] = {}
        for ref in refs:
            if ref not in held:
                continue
            held[ref].polled_at = now
            heads[ref] = held[ref].head
            if kind is PollKind.branch and heads[ref] is None:
                heads[ref] = _last_recorded(session, target.id, ref)
        jobs.append(PollJob(target_id=target.id, target_name=target.name, repo_url=target.repo_url, heads=heads))
    session.flush()
    return jobs


# --- record ----------------------------------------------------------------------------------------------


def _state(session: Session, target_id: int, kind: PollKind, ref: str) -> PollState | None:
    query = select(PollState).where(PollState.target_id == target_id, PollState.kind == kind, PollState.ref == ref)
    return session.scalars(query.with_for_update()).one_or_none()


def record_failure(factory: sessionmaker[Session], job: PollJob, kind: PollKind, refs: Sequence[str], error: str) -> None:
    """Keep why the poll of ``refs`` failed; their heads stay as they were (the next due poll tries again)."""
    with session_scope(factory) as session:
        for ref in refs:
            state = _state(session, job.target_id, kind, ref)
            if state is not None:
                state.error = error[-ERROR_MAX:]


def record_success(session: Session, job: PollJob, kind: PollKind, ref: str, *, head: str | None, note: str | None) -> None:
    state = _state(session, job.target_id, kind, ref)
    if state is None:  # the target was removed (cascade) or stopped watching the ref meanwhile
        return
    state.head = head
    state.succeeded_at = utcnow()
    state.error = None
    if note is not None:
        state.note = note
