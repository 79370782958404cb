"""One case over the commits of a branch, and the cases a history can be asked for."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import CaseResult, Commit, Run, Verdict
from service.queries.common import MAX_HISTORY, NotFoundError, QueryError, branch_of, get_target, on_history
from service.queries.findings import FindingLink, commit_version, finding_matcher


@dataclass(frozen=True)
class HistoryPoint:
    sha: str
    branch_order: int | None
    run_id: int
    verdict: Verdict
    log_e_value: float | None
    threshold: float | None
    tv_estimate: float | None
    tv_low: float | None
    tv_high: float | None
    acceptance_observed: float | None
    acceptance_expected: float | None
    fingerprint: str | None
    # The known finding that explains this failure; None for a new failure or a pass.
    finding: FindingLink | None = None


@dataclass(frozen=True)
class CaseHistory:
    target: str
    branch: str
    case_id: str
    # Oldest first, one point per commit (the case's result in the commit's latest run that has it).
    points: tuple[HistoryPoint, ...]


def case_history(session: Session, target_name: str, case_id: str, *, branch: str | None = None, limit: int = 1000) -> CaseHistory:
    """``case_id`` over the newest ``limit`` commits of ``branch`` (those with a result for it), oldest first."""
    if not 1 <= limit <= MAX_HISTORY:
        raise QueryError(f"limit must be between 1 and {MAX_HISTORY}")
    target = get_target(session, target_name)
    branch = branch_of(target, branch)
    # The branch's newest ``limit`` commits first (index on target, branch, branch_order), then their runs and
    # this case's results (indexes on runs.commit_id and case_results(run_id, case_id)): the cost follows
    # ``limit``, not the length of the whole history.
    newest = (
        select(Commit.id)
        .where(Commit.target_id == target.id, on_history(branch))
        .order_by(Commit.branch_order.desc())
        .limit(limit)
        .subquery()
    )
    # Plain columns, not CaseResult entities: building 1,000 ORM objects (with their JSON details) cost more
    # than the query itself.
    query = (
        select(
            Commit.sha,
            Commit.branch_order,
            Commit.branch,
            Run.library_version,
            Run.library_distribution,
            CaseResult.run_id,
            CaseResult.verdict,
            CaseResult.log_e_value,
            CaseResult.threshold,
            CaseResult.tv_estimate,
            CaseResult.tv_low,
            CaseResult.tv_high,
            CaseResult.acceptance_observed,
            CaseResult.acceptance_expected,
            CaseResult.fingerprint,
        )
        .join(Run, CaseResult.run_id == Run.id)
        .join(Commit, Run.commit_id == Commit.id)
        .where(Commit.id.in_(select(newest.c.id)), CaseResult.case_id == case_id)
        .order_by(Commit.branch_order.desc(), Run.id.desc())
    )
    matcher = finding_matcher(session, target.id)
    points: dict[str, HistoryPoint] = {}
    for row in session.execute(query):
        if row.sha not in points:  # else an older run of the same commit
            fields = row._asdict()
            commit_branch, library_version = fields.pop("branch"), fields.pop("library_version")
            distribution = fields.pop("library_distribution")
            finding = None
            if matcher and row.verdict is Verdict.FAIL:
                version = commit_version(row.sha, library_version)
                finding = matcher.match(
                    case_id, version=version, distribution=distribution, branch=commit_branch, branch_order=row.branch_order
                )
            points[row.sha] = HistoryPoint(**fields, finding=finding)
    if not points:
        known = session.scalar(select(CaseResult.id).where(CaseResult.case_id == case_id).limit(1))
        if known is None:
            raise NotFoundError(f"no results for case {case_id!r}")
    return CaseHistory(target=target.name, branch=branch, case_id=case_id, points=tuple(reversed(points.values())))


def case_ids(session: Session, target_name: str, *, branch: str | None = None) -> list[str]:
    """The case ids of the newest run on ``branch`` that has results (the cases a history can be asked for)."""
    target = get_target(session, target_name)
    run_id = session.scalar(
        select(Run.id)
        .join(Run.commit)
        .where(Commit.target_id == target.id, on_history(branch_of(target, branch)))
        .where(select(CaseResult.id).where(CaseResult.run_id == Run.id).exists())
        .order_by(Commit.branch_order.desc(), Run.id.desc())
        .limit(1)
    )
    if run_id is None:
        return []
    return list(session.scalars(select(CaseResult.case_id).where(CaseResult.run_id == run_id).order_by(CaseResult.case_id)))
