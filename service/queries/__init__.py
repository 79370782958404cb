"""Read-side queries over the history (they only read: writes are in their domain modules, e.g. :mod:`service.findings`,
:mod:`service.alerts`): the commits of a branch, runs, one case over commits, two commits compared;
and the known findings of each target (:mod:`service.queries.findings`), which the readers use to mark known failures.

The API (:mod:`service.routes`), the CLI (:mod:`service.cli`) and the dashboard
(:mod:`service.dashboard`) answer from these functions only. Each takes a :class:`~sqlalchemy.orm.Session`,
reads, and returns frozen dataclasses (no ORM objects escape, so nothing lazy-loads after the session ends).
Unknown names raise :class:`NotFoundError`; bad input (a cursor, an ambiguous sha) :class:`QueryError`.

Branch history is ordered by ``branch_order`` (increasing along the branch) and read newest first. A commit
stands for its latest run (highest run id); a case on a commit for that case's result in the latest run that
has it. The questions the readers share with the analysis (a branch's commits, the previous tested run, the
open alerts of a branch) are answered in :mod:`service.history`, so the two cannot disagree.
"""

from service.queries.alerts import AlertRow, alerts_by_state, get_alert, list_alerts
from service.queries.cases import CaseHistory, HistoryPoint, case_history, case_ids
from service.queries.commits import CommitPage, CommitRow, commits_page, parse_cursor
from service.queries.common import MAX_HISTORY, MAX_PAGE, SHA_PREFIX_MIN, NotFoundError, QueryError, get_target
from service.queries.compare import CaseComparison, Comparison, compare, resolve_sha
from service.queries.findings import (
    FindingLink,
    FindingMatcher,
    FindingRow,
    alert_findings,
    alert_regressions,
    commit_version,
    finding_matcher,
    get_finding,
    list_findings,
)
from service.queries.runs import CaseRow, RunDetail, run_detail
from service.queries.targets import BranchHead, TargetSummary, runs_by_status, targets_overview
from specwatch.report import coverage_summary

__all__ = [
    "MAX_HISTORY",
    "MAX_PAGE",
    "SHA_PREFIX_MIN",
    "AlertRow",
    "BranchHead",
    "CaseComparison",
    "CaseHistory",
    "CaseRow",
    "CommitPage",
    "CommitRow",
    "Comparison",
    "FindingLink",
    "FindingMatcher",
    "FindingRow",
    "HistoryPoint",
    "NotFoundError",
    "QueryError",
    "RunDetail",
    "TargetSummary",
    "alert_findings",
    "alert_regressions",
    "alerts_by_state",
    "case_history",
    "case_ids",
    "commit_version",
    "commits_page",
    "compare",
    "coverage_summary",
    "finding_matcher",
    "get_alert",
    "get_finding",
    "get_target",
    "list_alerts",
    "list_findings",
    "parse_cursor",
    "resolve_sha",
    "run_detail",
    "runs_by_status",
    "targets_overview",
]
