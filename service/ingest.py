"""Recording new commits of a target and queueing runs for them, whoever found them.

A GitHub push (:mod:`service.webhooks`), the branch poller and the PyPI release poller (``workers.pollers``)
all end here: :func:`record_commits` adds the commits a target does not know yet in branch order,
:func:`queue_runs` adds one ``queued`` run per commit and profile (never a second one), and
:func:`record_and_queue` does both with the target's commit policy. Domain functions: they flush, never
commit; the caller's unit of work commits and then enqueues the returned run ids
(:func:`service.queue.enqueue_runs`). Callers lock the target first (:func:`lock_targets`), so pushes and
polls of one target are serialised and branch order is assigned once per commit.

Releases are commits too: ``release:<version>`` (:func:`service.releases.release_sha`), on no branch
(``branch`` is ``None``), ordered by version (:func:`order_releases`), tested by installing that version
from the package index (the target's ``install_mode`` is ``pip``; its name is the package's name).

When GitHub statuses are configured (``RunOptions.status_dashboard_url``), queueing a run also writes the
commit's ``pending`` status to the notification outbox, in the same transaction (:mod:`service.notifications.statuses`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.ancestry import ancestry_order
from service.history import on_branch
from service.models import Commit, CommitPolicy, Run, RunPurpose, RunStatus, Target
from service.notifications.statuses import queue_status
from service.releases import release_sha
from service.settings import Settings
from service.textlimits import cut


@dataclass(frozen=True)
class RunOptions:
    """How new runs are made: the suite profile, the lease after which the sweeper re-enqueues them, and
    where GitHub statuses link to (None: no statuses are written)."""

    profile: str
    queued_lease: timedelta
    status_dashboard_url: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> RunOptions:
        token = settings.github_token
        return cls(
            profile=settings.run_profile,
            queued_lease=timedelta(seconds=settings.queued_lease_s),
            status_dashboard_url=settings.dashboard_url if token is not None and token.get_secret_value() else None,
        )


#: The most characters stored of a commit's message and of its author (name and email), whoever found the
#: commit (a signed push, git, a poller); longer ones are cut with a marker (issue 28, item 6). A message
#: longer than 16 KiB is rare (squash merges), and the timeline shows only its first line.
COMMIT_MESSAGE_MAX = 16 * 1024
AUTHOR_MAX = 255


@dataclass(frozen=True)
class NewCommit:
    """A commit as its finder describes it: git (pollers, the mirror) knows its parents; a push lists its commits
    oldest first, each taken as the next one's first parent (see :mod:`service.webhooks.deliveries`)."""

    sha: str
    parents: tuple[str, ...] = ()
    # False: parents inferred (a push's listing), kept only until git's own are recorded.
    exact_parents: bool = True
    author: str | None = None
    committed_at: datetime | None = None
    message: str | None = None


@dataclass
class Recorded:
    """What recording led to: how many commits were new, and the runs to enqueue after commit."""

    new_commits: int = 0
    run_ids: list[int] = field(default_factory=list)


def lock_targets(session: Session, target_ids: Iterable[int]) -> list[Target]:
    """The targets, locked (``SELECT .. FOR UPDATE``, in id order) until the caller's transaction ends."""
    ids = sorted(set(target_ids))
    return list(session.scalars(select(Target).where(Target.id.in_(ids)).order_by(Target.id).with_for_update()))


def record_commits(session: Session, target: Target, branch: str | None, commits: Sequence[NewCommit]) -> tuple[dict[str, Commit], int]:
    """Add the commits ``target`` does not know yet and put the branch in git order (:func:`reorder_branch`).

    ``commits`` is oldest first. Returns every listed commit's row by sha (known or new) and how many were new.
    A commit already known (from another branch, a push or an earlier poll) keeps its branch; its parents are
    filled in when unknown, and replaced by exact ones (git's) when they were inferred. New commits go after the branch's last one,
    then ancestry moves each to its place (a late-arriving ancestor before its descendants).
    """
    shas = [c.sha for c in commits]
    known = {c.sha: c for c in session.scalars(select(Commit).where(Commit.target_id == target.id, Commit.sha.in_(shas)))}
    order = session.scalar(select(func.max(Commit.branch_order)).where(Commit.target_id == target.id, on_branch(branch))) or 0
    new = 0
    learned = False
    for described in commits:
        if described.sha in known:
            existing = known[described.sha]
            if described.parents and list(described.parents) != existing.parents and (described.exact_parents or not existing.parents):
                existing.parents = list(described.parents)
                learned = True
            continue
        order += 1
        committed_at = described.committed_at
        if committed_at is not None and committed_at.tzinfo is None:
            committed_at = committed_at.replace(tzinfo=UTC)
        commit = Commit(
            target_id=target.id,
            sha=described.sha,
            parents=list(described.parents),
            branch=branch,
            branch_order=order,
            author=cut(described.author, AUTHOR_MAX),
            committed_at=committed_at,
            message=cut(described.message, COMMIT_MESSAGE_MAX),
        )
        session.add(commit)
        known[commit.sha] = commit
        new += 1
    session.flush()
    if branch is not None and (new or learned):
        reorder_branch(session, target, branch)
    return known, new


def reorder_branch(session: Session, target: Target, branch: str) -> int:
    """Renumber ``branch``'s commits in git order (:func:`service.ancestry.ancestry_order`); how many moved.

    Callers hold the target's lock (:func:`lock_targets`), so orders are assigned by one writer at a time.
    """
    commits = list(
        session.scalars(select(Commit).where(Commit.target_id == target.id, on_branch(branch)).order_by(Commit.branch_order, Commit.id))
    )
    by_sha = {c.sha: c for c in commits}
    ordered = ancestry_order([c.sha for c in commits], {c.sha: c.parents or [] for c in commits})
    first = min((c.branch_order for c in commits if c.branch_order is not None), default=1)
    moved = 0
    for offset, sha in enumerate(ordered):
        commit = by_sha[sha]
        if commit.branch_order != first + offset:
            commit.branch_order = first + offset
            moved += 1
    session.flush()
    return moved


def queue_runs(session: Session, commits: Iterable[Commit], options: RunOptions) -> list[int]:
    """A ``queued`` run of ``options.profile`` for each commit that has none yet; the new runs' ids, in order.

    With ``options.status_dashboard_url`` set, each new run's ``pending`` GitHub status goes to the outbox too.
    """
    by_id = {c.id: c for c in commits}
    tested = set(session.scalars(select(Run.commit_id).where(Run.commit_id.in_(list(by_id)), Run.profile == options.profile)))
    lease = datetime.now(UTC) + options.queued_lease
    runs = [
        Run(commit=commit, profile=options.profile, status=RunStatus.queued, purpose=RunPurpose.primary, lease_expires_at=lease)
        for commit_id, commit in by_id.items()
        if commit_id not in tested
    ]
    session.add_all(runs)
    session.flush()
    if options.status_dashboard_url is not None:
        for run in runs:
            queue_status(session, run, run.commit, "pending", options.status_dashboard_url)
    return [run.id for run in runs]


def selected_by_policy(policy: CommitPolicy, shas: Sequence[str], head: str) -> list[str]:
    """The commits that get a run: all of ``shas`` (``every``) or only the new ``head`` (``head``)."""
    return list(shas) if policy is CommitPolicy.every else [head]


def record_and_queue(
    session: Session, target: Target, branch: str, commits: Sequence[NewCommit], *, head: str, options: RunOptions
) -> Recorded:
    """Record ``commits`` (oldest first, ending with ``head``) on ``branch`` and queue runs per the target's policy."""
    known, new = record_commits(session, target, branch, commits)
    wanted = selected_by_policy(target.commit_policy, [c.sha for c in commits], head)
    return Recorded(new_commits=new, run_ids=queue_runs(session, [known[sha] for sha in wanted], options))


# --- releases ------------------------------------------------------------------------------------------


def order_releases(session: Session, target: Target, ordered_versions: Sequence[str]) -> None:
    """Renumber the target's release commits (``branch`` None) by ``ordered_versions`` (oldest first).

    A release published after a newer one (a backport such as 4.45.3 after 4.46.0) takes its place in version
    order; releases not listed keep their order after the listed ones.
    """
    rank = {release_sha(version): i for i, version in enumerate(ordered_versions, start=1)}
    releases = session.scalars(select(Commit).where(Commit.target_id == target.id, on_branch(None))).all()
    unlisted = sorted((c for c in releases if c.sha not in rank), key=lambda c: (c.branch_order or 0, c.id))
    for offset, commit in enumerate(unlisted, start=len(rank) + 1):
        rank[commit.sha] = offset
    for commit in releases:
        if commit.branch_order != rank[commit.sha]:
            commit.branch_order = rank[commit.sha]
    session.flush()
