"""The release poller: new final releases of pip-installed targets on the package index become queued runs.

It reads ``GET {pypi_url}/pypi/{name}/json`` with no transaction open, then records the releases it did not
know as commits ``release:<version>`` in one transaction per package; see :mod:`workers.pollers` for which
releases are recorded and which are tested.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx
from packaging.version import InvalidVersion, Version
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.after_commit import after_commit
from service.db import session_scope
from service.ingest import NewCommit, RunOptions, lock_targets, order_releases, queue_runs, record_commits
from service.models import Commit, CommitPolicy, PollKind
from service.releases import RELEASE_PREFIX, RELEASE_VERSION_MAX, release_sha, release_version
from workers.pollers.claims import (
    Enqueue,
    PackageOf,
    PollJob,
    PollReport,
    claim_due,
    default_package,
    record_failure,
    record_success,
    utcnow,
)

log = logging.getLogger(__name__)


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
    package_of: PackageOf = default_package,
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
                report.run_ids += _record_releases(factory, job, package, releases, options, enqueue=enqueue)
    return report


def _record_releases(
    factory: sessionmaker[Session], job: PollJob, package: str, releases: list[Release], options: RunOptions, *, enqueue: Enqueue
) -> list[int]:
    """Record the releases the target does not know yet, in version order, and queue runs (enqueued after the
    commit); the run ids."""
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
            record_success(session, job, PollKind.releases, package, head=_head(newest), note=None)
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
        if run_ids:
            after_commit(session, enqueue, run_ids)
        first = "first poll: " if not known else ""
        note = f"{first}{count} new release(s) of {package} up to {new[-1].version}, {len(run_ids)} run(s) queued"
        record_success(session, job, PollKind.releases, package, head=_head(newest), note=note)
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
