"""The notification outbox's rows: each written in the caller's transaction with its whole payload and a unique
``dedup_key`` (:func:`add_notification`), sent later by the workers (``workers.deliver_notifications``:
:mod:`workers.notify`); which channels are configured (:class:`NotifyConfig`), and where a message links a commit
(:func:`commit_url`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Commit, Notification, Target
from service.releases import release_version


@dataclass(frozen=True)
class NotifyConfig:
    """Which channels are configured, and where links point (no secrets here)."""

    slack: bool = False
    github: bool = False
    dashboard_url: str = "http://127.0.0.1:8000"


# GitHub owners are letters, digits and hyphens; repository names add '.' and '_' but are never '.' or '..'
# (which would make the status URL /repos/OWNER/../statuses/SHA point elsewhere in the API).
_GITHUB_REPO = re.compile(
    r"^(?:https?://github\.com/|git@github\.com:)(?P<repo>[A-Za-z0-9][A-Za-z0-9-]{0,38}/[\w.-]+?)(?:\.git)?/?$", re.ASCII
)


def github_repo(repo_url: str) -> str | None:
    """``owner/name`` of a GitHub repository URL, else None (also for a name of ``.`` or ``..``)."""
    match = _GITHUB_REPO.match(repo_url.strip())
    if match is None or match.group("repo").split("/")[1] in (".", ".."):
        return None
    return match.group("repo")


def commit_url(target: Target, commit: Commit) -> str | None:
    """Where people read the commit: GitHub for a commit, PyPI for a release; None for other hosts."""
    version = release_version(commit.sha)
    if version is not None:
        return f"https://pypi.org/project/{target.name}/{version}/"
    repo = github_repo(target.repo_url)
    return f"https://github.com/{repo}/commit/{commit.sha}" if repo else None


def add_notification(session: Session, row: Notification) -> int:
    """Add an outbox row unless one with its ``dedup_key`` exists; 1 if added, else 0."""
    if session.scalars(select(Notification.id).where(Notification.dedup_key == row.dedup_key)).first() is not None:
        return 0
    session.add(row)
    session.flush()
    return 1
