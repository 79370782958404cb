"""What every history query shares: its errors, page limits, and the lookups of a target, a branch and a commit's latest run."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from service.history import on_branch
from service.models import RELEASES_BRANCH, InstallMode, Run, Target

MAX_PAGE = 500
MAX_HISTORY = 5000
SHA_PREFIX_MIN = 4


class QueryError(ValueError):
    """The request cannot be answered as asked (bad cursor, ambiguous sha); the message says why."""


class NotFoundError(LookupError):
    """No such target, branch, commit, run or case."""


def get_target(session: Session, name: str) -> Target:
    target = session.scalar(select(Target).where(Target.name == name))
    if target is None:
        raise NotFoundError(f"no target named {name!r}")
    return target


def latest_runs(session: Session, commit_ids: Sequence[int]) -> dict[int, Run]:
    """The latest run (highest id) of each commit that has one."""
    if not commit_ids:
        return {}
    latest = select(Run.commit_id, func.max(Run.id).label("run_id")).where(Run.commit_id.in_(commit_ids)).group_by(Run.commit_id).subquery()
    runs = session.scalars(select(Run).join(latest, Run.id == latest.c.run_id))
    return {run.commit_id: run for run in runs}


def history_branches(target: Target) -> list[str]:
    """The histories a target has: its watched branches, after :data:`RELEASES_BRANCH` (its releases, commits on no
    branch) for a target installed from the package index, whose releases are what it watches."""
    return [RELEASES_BRANCH, *target.branches] if target.install_mode is InstallMode.pip else list(target.branches)


def branch_of(target: Target, branch: str | None) -> str:
    """The history a query reads: ``branch`` as asked, else the target's first (:func:`history_branches`)."""
    if branch is None:
        histories = history_branches(target)
        if not histories:
            raise NotFoundError(f"target {target.name!r} watches no branch")
        return histories[0]
    return branch


def on_history(branch: str) -> ColumnElement[bool]:
    """The commits of ``branch``, :data:`RELEASES_BRANCH` naming the release commits."""
    return on_branch(None if branch == RELEASES_BRANCH else branch)
