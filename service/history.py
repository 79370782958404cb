"""The history questions that the readers (queries, API, dashboard) and the analysis both ask, answered once.

A branch's history is its commits in ``branch_order`` (increasing along the branch); release commits are on no
branch (``branch`` NULL) and ordered by release. Three questions have one answer here, so that the run page and
the analysis cannot disagree:

- which commits are on a branch (:func:`on_branch`);
- which run is the **previous tested run** of a run (:func:`previous_tested_run`): the newest run of the same
  profile that is *tested* (``passed`` or ``failed``: a complete verdict; an ``error`` run's results are partial)
  and is not a ``confirmation`` run (it re-tests a commit whose own run, the failing one it confirms, is
  already there), on the nearest earlier commit of the same branch that has one. The run page's "same as previous" and the
  analysis's ``unchanged_cases`` both compare fingerprints with this run;
- which alerts of a branch are still open at a commit (:func:`open_alerts`).

Each function takes a :class:`~sqlalchemy.orm.Session` (or builds a statement) and only reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Select, select
from sqlalchemy.orm import Session

from service.models import RELEASES_BRANCH, Alert, AlertKind, AlertState, Commit, Run, RunPurpose, RunStatus

#: Runs with a complete verdict: what "tested" means for the previous tested run.
TESTED_STATUSES = frozenset({RunStatus.passed, RunStatus.failed})


def on_branch(branch: str | None) -> ColumnElement[bool]:
    """The commits of ``branch``; None: the release commits, which are on no branch."""
    return Commit.branch.is_(None) if branch is None else Commit.branch == branch


def alert_branch(commit: Commit) -> str:
    """The ``alerts.branch`` of ``commit``: its branch, or :data:`~service.models.RELEASES_BRANCH` for a release."""
    return commit.branch if commit.branch is not None else RELEASES_BRANCH


def earlier_runs(commit: Commit, profile: str) -> Select[Run]:
    """The non-confirmation runs of ``profile`` on the commits of ``commit``'s branch before it (any status).

    Confirmation runs are left out: each re-tests (with fresh seeds) a commit whose own run is already there,
    the failing run it confirms, so counting it would weigh that commit twice.
    """
    return (
        select(Run)
        .join(Commit, Run.commit_id == Commit.id)
        .where(
            Commit.target_id == commit.target_id,
            on_branch(commit.branch),
            Commit.branch_order < (commit.branch_order or 0),
            Run.profile == profile,
            Run.purpose != RunPurpose.confirmation,
        )
    )


def newest_earlier_run(session: Session, commit: Commit, profile: str, statuses: Sequence[RunStatus]) -> Run | None:
    """The newest of :func:`earlier_runs` in one of ``statuses``: nearest commit first, then the latest run."""
    query = earlier_runs(commit, profile).where(Run.status.in_(statuses))
    newest: Run | None = session.scalars(query.order_by(Commit.branch_order.desc(), Run.id.desc()).limit(1)).first()
    return newest


def previous_tested_run(session: Session, commit: Commit, profile: str) -> Run | None:
    """The previous tested run of a run of ``profile`` on ``commit`` (see the module docstring); None if none."""
    return newest_earlier_run(session, commit, profile, sorted(TESTED_STATUSES))


def open_alerts(
    session: Session, commit: Commit, *, at_commit: bool, kinds: Sequence[AlertKind] | None = None, lock: bool = False
) -> Sequence[Alert]:
    """The alerts of ``commit``'s branch that are not resolved and began before it (``at_commit``: or at it), by id.

    ``kinds`` narrows them; ``lock`` locks the alert rows (``FOR UPDATE OF alerts``) for a caller that changes them.
    """
    order = commit.branch_order or 0
    began = Commit.branch_order <= order if at_commit else Commit.branch_order < order
    query: Select[Any] = (
        select(Alert)
        .join(Commit, Alert.first_bad_commit_id == Commit.id)
        .where(Alert.target_id == commit.target_id, Alert.branch == alert_branch(commit), Alert.state != AlertState.resolved, began)
        .order_by(Alert.id)
    )
    if kinds is not None:
        query = query.where(Alert.kind.in_(kinds))
    if lock:
        query = query.with_for_update(of=Alert)
    return session.scalars(query).all()
