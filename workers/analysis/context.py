"""What every step of one analysis shares: its configuration, session, clock and report, and the rows it loads.

The steps (triage, confirmation, bisection, drift, alerts, resolution) take an :class:`Analysis` and write
through its session (add, flush, never commit); the task commits, then enqueues ``report.queued``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import CaseResult, Commit, Run, RunPurpose, RunStatus
from service.notifications.outbox import NotifyConfig


@dataclass(frozen=True)
class AnalysisConfig:
    confirm_failures: bool = True
    drift_baseline_runs: int = 5
    drift_alpha: float = 1e-4
    notify: NotifyConfig = field(default_factory=NotifyConfig)


@dataclass
class AnalysisReport:
    run_id: int
    outcome: str  # skipped | analysed
    reason: str | None = None
    kind: str | None = None
    queued: list[int] = field(default_factory=list)  # runs to enqueue after commit
    opened: list[int] = field(default_factory=list)  # alerts created by this analysis
    merged: list[int] = field(default_factory=list)  # existing alerts that got more cases
    resolved: list[int] = field(default_factory=list)
    reopened: list[int] = field(default_factory=list)  # resolved alerts that failed again
    notifications: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "outcome": self.outcome,
            "reason": self.reason,
            "kind": self.kind,
            "queued": self.queued,
            "opened": self.opened,
            "merged": self.merged,
            "resolved": self.resolved,
            "reopened": self.reopened,
            "notifications": self.notifications,
        }


@dataclass
class Analysis:
    """One analysis: its session, configuration, clock and report."""

    session: Session
    config: AnalysisConfig
    now: datetime
    report: AnalysisReport


def lock_run(session: Session, run_id: int) -> Run | None:
    return session.scalars(select(Run).where(Run.id == run_id).with_for_update()).one_or_none()


def load_cases(session: Session, run_id: int) -> dict[str, CaseResult]:
    """A run's case results by case id."""
    return {c.case_id: c for c in session.scalars(select(CaseResult).where(CaseResult.run_id == run_id))}


def child_run(ctx: Analysis, parent: Run, commit: Commit, purpose: RunPurpose, *, seed_attempt: int = 0) -> Run | None:
    """The confirmation or bisection run of ``parent`` on ``commit``, queued after commit; None if it exists."""
    session = ctx.session
    existing = session.scalars(select(Run).where(Run.parent_run_id == parent.id, Run.commit_id == commit.id)).one_or_none()
    if existing is not None:
        return None
    child = Run(
        commit_id=commit.id,
        profile=parent.profile,
        status=RunStatus.queued,
        purpose=purpose,
        parent_run_id=parent.id,
        seed_attempt=seed_attempt,
        max_attempts=parent.max_attempts,
    )
    session.add(child)
    session.flush()
    ctx.report.queued.append(child.id)
    return child
