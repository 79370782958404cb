"""Step 4 of a webhook request: the delivery recorded once, with what it led to, in the request's transaction.

The delivery (``X-GitHub-Delivery``, unique) is recorded with its outcome, and for a push to a watched branch
of a registered target: its commits and the runs the target's commit policy asks for (:mod:`service.ingest`).
A redelivery changes nothing. Nothing here commits; the route does, then enqueues the runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db import insert_ignoring_conflicts
from service.ingest import NewCommit, Recorded, RunOptions, lock_targets, record_and_queue
from service.models import Delivery, DeliveryStatus, InstallMode, Target
from service.repositories import repo_key
from service.textlimits import cut
from service.webhooks.payload import ZERO_SHA, PushCommit, PushEvent, parse_push

BRANCH_PREFIX = "refs/heads/"
TAG_PREFIX = "refs/tags/"
# What a delivery's reason (stored, and echoed in the answer) keeps of a ping's zen and a repository's name,
# and the longest reason in all; past them, cut with a marker (issue 28, item 6).
ZEN_MAX, REPOSITORY_MAX, REASON_MAX = 200, 200, 2000


class Outcome(StrEnum):
    accepted = "accepted"
    ignored = "ignored"
    duplicate = "duplicate"


@dataclass
class Ingested:
    """What a delivery led to: the runs to enqueue once the transaction has committed."""

    outcome: Outcome
    reason: str | None = None
    commits: int = 0
    run_ids: list[int] = field(default_factory=list)


def ingest(session: Session, *, delivery_id: str, event: str, payload: dict[str, Any], options: RunOptions) -> Ingested:
    """Record one verified delivery and what it leads to (flushed, not committed); a redelivery is a no-op.

    Raises :class:`~service.webhooks.payload.PayloadError` (before anything is added) when a ``push`` payload is malformed.
    """
    push = parse_push(payload) if event == "push" else None
    if session.scalar(select(Delivery.id).where(Delivery.github_delivery_id == delivery_id)) is not None:
        return Ingested(Outcome.duplicate, f"delivery {delivery_id} was already processed")
    values: dict[str, Any] = {"github_delivery_id": delivery_id, "event": event, "status": DeliveryStatus.ignored}
    if push is not None:
        values.update(ref=push.ref, before_sha=push.before, after_sha=push.after, forced=push.forced)
    delivery = _insert_delivery(session, values)
    if delivery is None:
        return Ingested(Outcome.duplicate, f"delivery {delivery_id} was already processed")

    if event == "ping":
        result = Ingested(Outcome.ignored, f"ping (zen: {cut(str(payload.get('zen', '')), ZEN_MAX)})")
    elif push is None:
        result = Ingested(Outcome.ignored, f"event {event!r} is not handled")
    else:
        result = ingest_push(session, push, options)
    delivery.status = DeliveryStatus.accepted if result.outcome is Outcome.accepted else DeliveryStatus.ignored
    delivery.reason = result.reason = cut(result.reason, REASON_MAX)
    session.flush()
    return result


def _insert_delivery(session: Session, values: dict[str, Any]) -> Delivery | None:
    """Insert the delivery unless its id is taken (then ``None``): ``INSERT .. ON CONFLICT DO NOTHING``.

    A concurrent request with the same id waits for the other's transaction and then inserts nothing. This
    avoids a savepoint, which on SQLite (pysqlite) would commit the outer transaction when released.
    """
    statement = insert_ignoring_conflicts(session, Delivery, values, [Delivery.github_delivery_id])
    if statement is None:
        delivery = Delivery(**values)
        session.add(delivery)
        session.flush()
        return delivery
    delivery_id = session.scalar(statement.returning(Delivery.id))
    return None if delivery_id is None else session.get_one(Delivery, delivery_id)


def ingest_push(session: Session, push: PushEvent, options: RunOptions) -> Ingested:
    """Record a push's commits for every source-installed target that watches its repository and branch,
    and queue runs for those the targets' commit policies select."""
    if push.ref.startswith(TAG_PREFIX):
        return Ingested(Outcome.ignored, f"tag push {push.ref}: tags are not tested from pushes")
    if not push.ref.startswith(BRANCH_PREFIX):
        return Ingested(Outcome.ignored, f"ref {push.ref} is not a branch")
    branch = push.ref.removeprefix(BRANCH_PREFIX)
    if push.deleted or push.after in ZERO_SHA:
        return Ingested(Outcome.ignored, f"branch {branch} was deleted")

    keys = push.repo_keys()
    matching = [t.id for t in session.scalars(select(Target)) if repo_key(t.repo_url) in keys]
    repository = cut(push.repository.full_name or push.repository.clone_url or "?", REPOSITORY_MAX)
    if not matching:
        return Ingested(Outcome.ignored, f"repository {repository} is not a registered target")
    # Serialise pushes (and pollers) per target, so branch order is assigned once per commit.
    targets = lock_targets(session, matching)
    watching = [t for t in targets if branch in t.branches]
    if not watching:
        return Ingested(Outcome.ignored, f"branch {branch} of {repository} is not watched by {', '.join(t.name for t in targets)}")

    result = Ingested(Outcome.ignored)
    notes: list[str] = []
    for target in watching:
        if target.install_mode is not InstallMode.source:
            notes.append(f"{target.name}: installs releases ({target.install_mode.value}), pushes are not tested")
            continue
        recorded = _record_push(session, target, branch, push, options)
        result.commits += recorded.new_commits
        result.run_ids += recorded.run_ids
        notes.append(f"{target.name}: {recorded.new_commits} new commit(s), {len(recorded.run_ids)} run(s) queued")
    forced = "forced push, " if push.forced else ""
    result.reason = f"{forced}{branch} {push.before[:12]}..{push.after[:12]}: " + "; ".join(notes)
    if result.commits or result.run_ids:
        result.outcome = Outcome.accepted
    return result


def _record_push(session: Session, target: Target, branch: str, push: PushEvent, options: RunOptions) -> Recorded:
    """Add the push's unknown commits to ``target`` (in git order) and runs per its policy."""
    return record_and_queue(session, target, branch, pushed_commits(push), head=push.after, options=options)


def pushed_commits(push: PushEvent) -> list[NewCommit]:
    """The push's commits as :func:`service.ingest.record_commits` takes them, oldest first.

    GitHub's payload carries no parents, but lists the pushed commits oldest first after ``before``: each is
    taken as the next one's first parent (exact for a linear push; a merge's side commits are approximated, so
    they are marked inexact, and the parents git reports later, from a poll or the mirror, replace them).
    That is what puts a late push of a head's ancestors before the head a poll recorded.
    """
    previous = None if push.before in ZERO_SHA else push.before
    described = []
    for pushed in push.pushed_commits():
        described.append(replace(_described(pushed), parents=(previous,) if previous else (), exact_parents=False))
        previous = pushed.id
    return described


def _described(pushed: PushCommit) -> NewCommit:
    """A commit as a push describes it (its parents: :func:`pushed_commits`)."""
    author = None
    if pushed.author is not None and (pushed.author.name or pushed.author.email):
        author = " ".join(filter(None, [pushed.author.name, f"<{pushed.author.email}>" if pushed.author.email else None]))
    return NewCommit(sha=pushed.id, author=author, committed_at=pushed.timestamp, message=pushed.message)
