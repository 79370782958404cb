"""The commits of a branch, newest first and a page at a time: the timeline (each commit's failures split into
known findings and new failures)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import CaseResult, Commit, RunStatus, Verdict
from service.queries.common import MAX_PAGE, NotFoundError, QueryError, branch_of, get_target, history_branches, latest_runs, on_history
from service.queries.findings import FindingLink, commit_version, finding_matcher


@dataclass(frozen=True)
class CommitRow:
    sha: str
    branch_order: int | None
    author: str | None
    committed_at: datetime | None
    message: str | None
    run_id: int | None
    status: RunStatus | None
    failed_cases: int
    # The first failing commit of a streak of new failures: its run failed, not only on known findings, and the
    # previous commit's did not (it passed, has no run, or failed only on known findings).
    first_failing: bool
    # How many of the failed cases a known finding explains, and those findings (by key).
    known_failed_cases: int = 0
    findings: tuple[FindingLink, ...] = ()
    # Why its latest run could not test it (error, uninstallable; the last install failure of a run retrying), and
    # whether that was the target's configuration rather than the commit.
    error: str | None = None
    configuration_error: bool = False
    # A re-run asked for by hand: why, and by whom (service.reruns).
    rerun_reason: str | None = None
    rerun_by: str | None = None

    @property
    def known_only(self) -> bool:
        """Its run failed, and a known finding explains every failed case: "still the known bug", not new."""
        return self.status is RunStatus.failed and self.failed_cases > 0 and self.known_failed_cases == self.failed_cases


@dataclass(frozen=True)
class CommitPage:
    target: str
    branch: str
    commits: tuple[CommitRow, ...]
    # Pass it back as ``cursor`` for the next (older) page; None on the last page.
    next_cursor: str | None


def parse_cursor(cursor: str | None) -> int | None:
    """A page cursor is the ``branch_order`` of the last commit of the previous page (a non-negative integer)."""
    if cursor is None or cursor == "":
        return None
    if not (cursor.isascii() and cursor.isdigit()) or len(cursor) > 18:
        raise QueryError(f"invalid cursor {cursor!r}: pass back the next_cursor of the previous page")
    return int(cursor)


def commits_page(
    session: Session, target_name: str, *, branch: str | None = None, cursor: str | None = None, limit: int = 50
) -> CommitPage:
    """One page of a branch's commits, newest first, each with its latest run; ``cursor`` continues a page."""
    if not 1 <= limit <= MAX_PAGE:
        raise QueryError(f"limit must be between 1 and {MAX_PAGE}")
    before = parse_cursor(cursor)
    target = get_target(session, target_name)
    branch = branch_of(target, branch)
    query = select(Commit).where(Commit.target_id == target.id, on_history(branch))
    if before is not None:
        query = query.where(Commit.branch_order < before)
    # One more than the page: whether there is a next page, and the predecessor of the page's oldest commit.
    commits = list(session.scalars(query.order_by(Commit.branch_order.desc()).limit(limit + 1)))
    if before is None and not commits and branch not in history_branches(target):
        raise NotFoundError(f"target {target.name!r} has no branch {branch!r}")
    runs = latest_runs(session, [c.id for c in commits])
    failed_cases = _failed_cases(session, [run.id for run in runs.values()])
    matcher = finding_matcher(session, target.id)
    known_of: dict[int, dict[str, FindingLink]] = {}
    for commit in commits:
        run = runs.get(commit.id)
        failures = failed_cases.get(run.id, []) if run else []
        version = commit_version(commit.sha, run.library_version if run else None)
        distribution = run.library_distribution if run else None
        match = (
            matcher.match_all(failures, version=version, distribution=distribution, branch=commit.branch, branch_order=commit.branch_order)
            if matcher
            else {}
        )
        known_of[commit.id] = match

    def new_failure(commit: Commit | None) -> bool:
        """Its run failed, and not only on known findings."""
        run = runs.get(commit.id) if commit is not None else None
        if commit is None or run is None or run.status is not RunStatus.failed:
            return False
        return len(known_of[commit.id]) < len(failed_cases.get(run.id, []))

    rows = []
    for index, commit in enumerate(commits[:limit]):
        run = runs.get(commit.id)
        previous = commits[index + 1] if index + 1 < len(commits) else None
        failures = failed_cases.get(run.id, []) if run else []
        known = known_of[commit.id]
        rows.append(
            CommitRow(
                sha=commit.sha,
                branch_order=commit.branch_order,
                author=commit.author,
                committed_at=commit.committed_at,
                message=commit.message,
                run_id=run.id if run else None,
                status=run.status if run else None,
                failed_cases=len(failures),
                # Where a streak of new failures starts: a failure only on known findings is not a new one.
                first_failing=new_failure(commit) and not new_failure(previous),
                known_failed_cases=len(known),
                findings=tuple({link.key: link for link in known.values()}.values()),
                error=run.error if run else None,
                configuration_error=run.configuration_error if run else False,
                rerun_reason=run.rerun_reason if run else None,
                rerun_by=run.rerun_by if run else None,
            )
        )
    more = len(commits) > limit and rows[-1].branch_order is not None
    return CommitPage(target=target.name, branch=branch, commits=tuple(rows), next_cursor=str(rows[-1].branch_order) if more else None)


def _failed_cases(session: Session, run_ids: Sequence[int]) -> dict[int, list[str]]:
    """The failed case ids of each run."""
    if not run_ids:
        return {}
    failed: dict[int, list[str]] = {}
    rows = session.execute(
        select(CaseResult.run_id, CaseResult.case_id).where(CaseResult.run_id.in_(run_ids), CaseResult.verdict == Verdict.FAIL)
    )
    for run_id, case_id in rows:
        failed.setdefault(run_id, []).append(case_id)
    return failed
