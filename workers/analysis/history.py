"""The loader: one typed view of a branch's history, read once, for the pure decisions over it.

:func:`load_branch` reads the commits of a run's branch up to its commit (oldest first), their
non-confirmation runs of the run's profile and those runs' case results, and returns a frozen
:class:`BranchHistory`. The bisection decides over it without further queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.history import on_branch
from service.models import CaseResult, Commit, Run, RunPurpose, RunStatus


@dataclass(frozen=True)
class TestedRun:
    """A run of one commit as the decisions need it: its status, who asked for it, its cases by id."""

    __test__ = False  # not a pytest class

    id: int
    status: RunStatus
    parent_run_id: int | None
    cases: dict[str, CaseResult]


@dataclass(frozen=True)
class CommitHistory:
    commit: Commit
    runs: tuple[TestedRun, ...]  # by id, oldest first


@dataclass(frozen=True)
class BranchHistory:
    """The commits of a branch in branch order (oldest first), each with its runs of one profile."""

    commits: tuple[CommitHistory, ...]

    @property
    def shas(self) -> list[str]:
        return [c.commit.sha for c in self.commits]

    def commit(self, sha: str) -> Commit | None:
        return next((c.commit for c in self.commits if c.commit.sha == sha), None)


def load_branch(session: Session, run: Run, *, since_order: int | None = None) -> BranchHistory:
    """``run``'s branch from ``since_order`` (inclusive; None: the start) to its commit, with the runs of its profile."""
    commit = run.commit
    commits: Sequence[Commit] = session.scalars(
        select(Commit)
        .where(
            Commit.target_id == commit.target_id,
            on_branch(commit.branch),
            Commit.branch_order <= (commit.branch_order or 0),
            Commit.branch_order >= (since_order if since_order is not None else 0),
        )
        .order_by(Commit.branch_order)
    ).all()
    runs = session.scalars(
        select(Run)
        .where(Run.commit_id.in_([c.id for c in commits]), Run.profile == run.profile, Run.purpose != RunPurpose.confirmation)
        .order_by(Run.id)
    ).all()
    cases_of: dict[int, dict[str, CaseResult]] = {}
    for case in session.scalars(select(CaseResult).where(CaseResult.run_id.in_([r.id for r in runs]))):
        cases_of.setdefault(case.run_id, {})[case.case_id] = case
    return BranchHistory(
        tuple(
            CommitHistory(c, tuple(TestedRun(r.id, r.status, r.parent_run_id, cases_of.get(r.id, {})) for r in runs if r.commit_id == c.id))
            for c in commits
        )
    )
