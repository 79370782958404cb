"""The pollers: new commits of watched branches and new releases on the package index become queued runs.

Most users cannot add a webhook to the upstream library they watch; beat runs both pollers every
``poll_interval_s`` and each target's own poll interval decides whether it is due. A poller reaches the same
ingest step as a webhook (docs/architecture.md §1 and §5).

A poll has three steps, so that no transaction is held open across the network:

1. **claim** (:func:`claim_due`, one transaction): the due targets' poll states (``poll_states``, one per
   watched branch or per package) are locked with ``SKIP LOCKED`` and stamped ``polled_at = now``, so a
   second poller running at the same time skips them;
2. **look** (no transaction): ``git ls-remote`` for the branches' heads, then the new commits from the
   target's mirror (:class:`workers.checkout.MirrorCache`), or the package's release list from
   ``GET {pypi_url}/pypi/{name}/json``;
3. **record** (one transaction per branch or package): the target is locked (serialised with webhooks), the
   new commits are recorded and runs queued per the target's commit policy (:mod:`service.ingest`), the
   state's head moves; the runs are enqueued after the commit.

Branches: the first poll of a branch records only its head (the history before specwatch watched it is not
tested); later polls record every commit between the old and the new head along the first-parent chain,
oldest first. A forced push (the old head is not an ancestor of the new one) records only the new head and
says so in the state's ``note``. An unreachable remote or a missing branch is logged and kept in the state's
``error``; the head is unchanged and the next due poll tries again. Nothing is raised for them.

Releases: final releases only (pre-releases, development releases and releases whose every file is yanked
are skipped), recorded as commits ``release:<version>`` ordered by :class:`packaging.version.Version`. The
first poll records every release and queues a run for the newest only; later polls queue runs for the new
releases per the target's policy (``every``: each, ``head``: the newest of them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx
from packaging.version import InvalidVersion, Version
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db import insert_ignoring_conflicts, session_scope
from service.ingest import (
    NewCommit,
    Recorded,
    RunOptions,
    lock_targets,
    order_releases,
    queue_runs,
    record_and_queue,
    record_commits,
)
from service.models import Commit, CommitPolicy, InstallMode, PollKind, PollState, Target
from service.releases import RELEASE_PREFIX, RELEASE_VERSION_MAX, release_sha, release_version
from workers.checkout import CheckoutError, GitCommit, MirrorCache

log = logging.getLogger(__name__)

AUTHOR_MAX = 255
ERROR_MAX = 2000

#: Called with the ids of runs whose transaction committed (``service.queue.enqueue_runs`` in the tasks).
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


# --- claim (both pollers) -------------------------------------------------------------------------------


#: The package on the index whose releases a pip-installed target tests, from (target name, adapter).
PackageOf = Callable[[str, str], str]


def _target_name(name: str, adapter: str) -> str:
    return name


def _polled_refs(target: Target, kind: PollKind, package_of: PackageOf = _target_name) -> list[str]:
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
    session: Session, kind: PollKind, *, now: datetime, release_interval_s: int = 3600, package_of: PackageOf = _target_name
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


# --- record (both pollers) ------------------------------------------------------------------------------


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


def _record_success(session: Session, job: PollJob, kind: PollKind, ref: str, *, head: str | None, note: str | None) -> None:
    state = _state(session, job.target_id, kind, ref)
    if state is None:  # the target was removed (cascade) or stopped watching the ref meanwhile
        return
    state.head = head
    state.succeeded_at = utcnow()
    state.error = None
    if note is not None:
        state.note = note


# --- branches -------------------------------------------------------------------------------------------


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
            _record_success(session, job, PollKind.branch, branch, head=new, note=None)
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
        _record_success(session, job, PollKind.branch, branch, head=new, note=note)
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
    if recorded.run_ids:
        enqueue(recorded.run_ids)
    return None


def _branch_note(branch: str, old: str | None, new: str, forced: bool, recorded: Recorded) -> str:
    if old is None:
        what = f"first poll of {branch}: head {new[:12]} recorded"
    elif forced:
        what = f"forced push on {branch}: {old[:12]} is not an ancestor of {new[:12]}; recorded the new head only"
    else:
        what = f"{branch} {old[:12]}..{new[:12]}"
    return f"{what}; {recorded.new_commits} new commit(s), {len(recorded.run_ids)} run(s) queued"


# --- releases -------------------------------------------------------------------------------------------


class PackageIndexError(Exception):
    """The package index did not give a usable release list."""


@dataclass(frozen=True)
class Release:
    version: str
    parsed: Version
    uploaded_at: datetime | None


def _upload_time(files: list[dict[str, Any]]) -> datetime | None:
    times = []
    for file in files:
        stamp = file.get("upload_time_iso_8601") or file.get("upload_time")
        if isinstance(stamp, str):
            try:
                parsed = datetime.fromisoformat(stamp)
            except ValueError:
                continue
            times.append(parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC))
    return min(times, default=None)


def parse_releases(payload: Any) -> list[Release]:
    """The final releases with at least one file that is not yanked, oldest version first.

    Skipped: versions that are not PEP 440, pre-releases and development releases, releases without files or
    whose files are all yanked, versions too long to be a commit id.
    """
    releases = payload.get("releases") if isinstance(payload, dict) else None
    if not isinstance(releases, dict):
        raise PackageIndexError("the index's answer has no 'releases' object")
    found = []
    for version, files in releases.items():
        try:
            parsed = Version(version)
        except InvalidVersion:
            log.debug("release_skipped version=%r reason=not PEP 440", version)
            continue
        if parsed.is_prerelease or len(version) > RELEASE_VERSION_MAX or not isinstance(files, list):
            continue
        live = [f for f in files if isinstance(f, dict) and not f.get("yanked", False)]
        if live:
            found.append(Release(version=version, parsed=parsed, uploaded_at=_upload_time(live)))
    return sorted(found, key=lambda r: r.parsed)


def fetch_releases(client: httpx.Client, index_url: str, package: str) -> list[Release]:
    """``GET {index_url}/pypi/{package}/json``, parsed by :func:`parse_releases`; :class:`PackageIndexError` on
    any failure (network, HTTP status, JSON)."""
    url = f"{index_url.rstrip('/')}/pypi/{quote(package, safe='')}/json"
    try:
        response = client.get(url)
        response.raise_for_status()
        payload = response.json()
    except httpx.HTTPStatusError as exc:
        raise PackageIndexError(f"GET {url}: HTTP {exc.response.status_code}") from exc
    except httpx.HTTPError as exc:
        raise PackageIndexError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
    except ValueError as exc:
        raise PackageIndexError(f"GET {url}: not JSON: {exc}") from exc
    return parse_releases(payload)


def poll_releases(
    factory: sessionmaker[Session],
    *,
    index_url: str,
    options: RunOptions,
    enqueue: Enqueue,
    now: datetime | None = None,
    timeout_s: float = 60,
    release_interval_s: int = 3600,
    transport: httpx.BaseTransport | None = None,
    package_of: PackageOf = _target_name,
) -> PollReport:
    """Poll the package index for every due pip-installed target; see the module docstring. Raises only for
    infrastructure errors (the database); the index's problems are recorded on the poll states. ``package_of``
    names the package a target's releases come from (default: the target's name)."""
    with session_scope(factory) as session:
        jobs = claim_due(session, PollKind.releases, now=now or utcnow(), release_interval_s=release_interval_s, package_of=package_of)
    report = PollReport()
    if not jobs:
        return report
    with httpx.Client(timeout=httpx.Timeout(timeout_s), follow_redirects=True, transport=transport) as client:
        for job in jobs:
            report.polled.append(job.target_name)
            for package in job.heads:
                try:
                    releases = fetch_releases(client, index_url, package)
                except PackageIndexError as exc:
                    log.warning("poll_index_failed target=%s package=%s error=%s", job.target_name, package, exc)
                    record_failure(factory, job, PollKind.releases, [package], str(exc))
                    report.errors[f"{job.target_name}/{package}"] = str(exc)
                    continue
                run_ids = _record_releases(factory, job, package, releases, options)
                report.run_ids += run_ids
                if run_ids:
                    enqueue(run_ids)
    return report


def _record_releases(factory: sessionmaker[Session], job: PollJob, package: str, releases: list[Release], options: RunOptions) -> list[int]:
    """Record the releases the target does not know yet, in version order, and queue runs; the run ids."""
    with session_scope(factory) as session:
        targets = lock_targets(session, [job.target_id])
        if not targets:
            return []
        target = targets[0]
        known_shas = session.scalars(select(Commit.sha).where(Commit.target_id == target.id, Commit.sha.startswith(RELEASE_PREFIX)))
        known = {version for sha in known_shas if (version := release_version(sha)) is not None}
        new = [r for r in releases if r.version not in known]
        newest = releases[-1].version if releases else None
        if not new:
            _record_success(session, job, PollKind.releases, package, head=_head(newest), note=None)
            return []
        described = [
            NewCommit(
                sha=release_sha(r.version), committed_at=r.uploaded_at, message=f"{package} {r.version}, released on the package index"
            )
            for r in new
        ]
        commits, count = record_commits(session, target, None, described)
        order_releases(session, target, sorted(known | {r.version for r in new}, key=_version_key))
        if not known:  # first sight: the history is recorded, the newest release is tested
            tested = [new[-1]]
        elif target.commit_policy is CommitPolicy.every:
            tested = new
        else:
            tested = [new[-1]]
        run_ids = queue_runs(session, [commits[release_sha(r.version)] for r in tested], options)
        first = "first poll: " if not known else ""
        note = f"{first}{count} new release(s) of {package} up to {new[-1].version}, {len(run_ids)} run(s) queued"
        _record_success(session, job, PollKind.releases, package, head=_head(newest), note=note)
    log.info("poll_releases_found target=%s package=%s new=%s runs=%s", job.target_name, package, [r.version for r in new], run_ids)
    return run_ids


def _head(version: str | None) -> str | None:
    return None if version is None else release_sha(version)


def _version_key(version: str) -> tuple[int, Version | str]:
    """Sort key of recorded versions: PEP 440 order; anything unparsable (never recorded by us) first."""
    try:
        return (1, Version(version))
    except InvalidVersion:
        return (0, version)
