"""The targets: each watched branch's head with its latest run, and the runs by status (for metrics)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Commit, Run, RunStatus, Target
from service.queries.common import history_branches, latest_runs, on_history


@dataclass(frozen=True)
class BranchHead:
    branch: str
    sha: str | None
    branch_order: int | None
    status: RunStatus | None
    commits: int


@dataclass(frozen=True)
class TargetSummary:
    name: str
    repo_url: str
    adapter: str
    branches: tuple[BranchHead, ...]
    runs_by_status: dict[str, int]


def targets_overview(session: Session) -> list[TargetSummary]:
    """Every target with the head of each watched branch and its latest run's status, by name."""
    summaries = []
    for target in session.scalars(select(Target).order_by(Target.name)):
        heads = []
        for branch in history_branches(target):
            head = session.scalars(
                select(Commit).where(Commit.target_id == target.id, on_history(branch)).order_by(Commit.branch_order.desc()).limit(1)
            ).first()
            count = session.scalar(select(func.count()).select_from(Commit).where(Commit.target_id == target.id, on_history(branch)))
            run = latest_runs(session, [head.id]).get(head.id) if head else None
            heads.append(
                BranchHead(
                    branch=branch,
                    sha=head.sha if head else None,
                    branch_order=head.branch_order if head else None,
                    status=run.status if run else None,
                    commits=count or 0,
                )
            )
        statuses = session.execute(
            select(Run.status, func.count()).join(Run.commit).where(Commit.target_id == target.id).group_by(Run.status)
        )
        summaries.append(
            TargetSummary(
                name=target.name,
                repo_url=target.repo_url,
                adapter=target.adapter,
                branches=tuple(heads),
                runs_by_status={status.value: count for status, count in statuses},
            )
        )
    return summaries


def runs_by_status(session: Session) -> dict[RunStatus, int]:
    """How many runs are in each status (every status present, zeros included)."""
    found = dict(session.execute(select(Run.status, func.count()).group_by(Run.status)).all())
    return {status: found.get(status, 0) for status in RunStatus}
