"""Read-side queries over the history: the commits of a branch, runs, one case over commits, two commits compared.

The API (:mod:`service.api_query`), the CLI (:mod:`service.cli`) and the dashboard
(:mod:`service.dashboard`) answer from these functions only. Each takes a :class:`~sqlalchemy.orm.Session`,
reads, and returns frozen dataclasses (no ORM objects escape, so nothing lazy-loads after the session ends).
Unknown names raise :class:`NotFoundError`; bad input (a cursor, an ambiguous sha) :class:`QueryError`.

Branch history is ordered by ``branch_order`` (increasing along the branch) and read newest first. A commit
stands for its latest run (highest run id); a case on a commit for that case's result in the latest run that
has it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Alert, AlertKind, AlertState, CaseResult, Commit, Run, RunStatus, Target, Verdict

MAX_PAGE = 500
MAX_HISTORY = 5000
SHA_PREFIX_MIN = 4


class QueryError(ValueError):
    """The request cannot be answered as asked (bad cursor, ambiguous sha); the message says why."""


class NotFoundError(LookupError):
    """No such target, branch, commit, run or case."""


# --- targets ---------------------------------------------------------------------------------------------


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


def get_target(session: Session, name: str) -> Target:
    target = session.scalar(select(Target).where(Target.name == name))
    if target is None:
        raise NotFoundError(f"no target named {name!r}")
    return target


def _latest_runs(session: Session, commit_ids: Sequence[int]) -> dict[int, Run]:
    """The latest run (highest id) of each commit that has one."""
    if not commit_ids:
        return {}
    latest = select(Run.commit_id, func.max(Run.id).label("run_id")).where(Run.commit_id.in_(commit_ids)).group_by(Run.commit_id).subquery()
    runs = session.scalars(select(Run).join(latest, Run.id == latest.c.run_id))
    return {run.commit_id: run for run in runs}


def targets_overview(session: Session) -> list[TargetSummary]:
    """Every target with the head of each watched branch and its latest run's status, by name."""
    summaries = []
    for target in session.scalars(select(Target).order_by(Target.name)):
        heads = []
        for branch in target.branches:
            head = session.scalars(
                select(Commit).where(Commit.target_id == target.id, Commit.branch == branch).order_by(Commit.branch_order.desc()).limit(1)
            ).first()
            count = session.scalar(select(func.count()).select_from(Commit).where(Commit.target_id == target.id, Commit.branch == branch))
            run = _latest_runs(session, [head.id]).get(head.id) if head else None
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


# --- commits of a branch (the timeline) --------------------------------------------------------------------


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
    # The first failing commit of a failure streak: its run failed and the previous commit's did not.
    first_failing: bool


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


def _branch_of(target: Target, branch: str | None) -> str:
    if branch is None:
        if not target.branches:
            raise NotFoundError(f"target {target.name!r} watches no branch")
        return target.branches[0]
    return branch


def commits_page(
    session: Session, target_name: str, *, branch: str | None = None, cursor: str | None = None, limit: int = 50
) -> CommitPage:
    """One page of a branch's commits, newest first, each with its latest run; ``cursor`` continues a page."""
    if not 1 <= limit <= MAX_PAGE:
        raise QueryError(f"limit must be between 1 and {MAX_PAGE}")
    before = parse_cursor(cursor)
    target = get_target(session, target_name)
    branch = _branch_of(target, branch)
    query = select(Commit).where(Commit.target_id == target.id, Commit.branch == branch)
    if before is not None:
        query = query.where(Commit.branch_order < before)
    # One more than the page: whether there is a next page, and the predecessor of the page's oldest commit.
    commits = list(session.scalars(query.order_by(Commit.branch_order.desc()).limit(limit + 1)))
    if before is None and not commits and branch not in target.branches:
        raise NotFoundError(f"target {target.name!r} has no branch {branch!r}")
    runs = _latest_runs(session, [c.id for c in commits])
    failed_counts = _failed_counts(session, [run.id for run in runs.values()])
    rows = []
    for index, commit in enumerate(commits[:limit]):
        run = runs.get(commit.id)
        previous = commits[index + 1] if index + 1 < len(commits) else None
        previous_run = runs.get(previous.id) if previous else None
        failed = run is not None and run.status is RunStatus.failed
        rows.append(
            CommitRow(
                sha=commit.sha,
                branch_order=commit.branch_order,
                author=commit.author,
                committed_at=commit.committed_at,
                message=commit.message,
                run_id=run.id if run else None,
                status=run.status if run else None,
                failed_cases=failed_counts.get(run.id, 0) if run else 0,
                first_failing=failed and (previous_run is None or previous_run.status is not RunStatus.failed),
            )
        )
    more = len(commits) > limit and rows[-1].branch_order is not None
    return CommitPage(target=target.name, branch=branch, commits=tuple(rows), next_cursor=str(rows[-1].branch_order) if more else None)


def _failed_counts(session: Session, run_ids: Sequence[int]) -> dict[int, int]:
    if not run_ids:
        return {}
    counts = session.execute(
        select(CaseResult.run_id, func.count())
        .where(CaseResult.run_id.in_(run_ids), CaseResult.verdict == Verdict.fail)
        .group_by(CaseResult.run_id)
    )
    return dict(counts.all())


# --- runs ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseRow:
    case_id: str
    verdict: Verdict
    lossless: bool | None
    conformance: bool | None
    n_trials: int | None
    e_value: float | None
    log_e_value: float | None
    threshold: float | None
    # Descriptive, not guarantees: computed at a data-dependent stop on the case's headline check.
    tv_estimate: float | None
    tv_low: float | None
    tv_high: float | None
    acceptance_observed: float | None
    acceptance_expected: float | None
    fingerprint: str | None
    duration_s: float | None
    # Whether the fingerprint equals the previous tested commit's on the branch ("behaviour unchanged");
    # None without a previous result or a fingerprint on either side.
    same_as_previous: bool | None = None
    # Speculative end-to-end cases: drafts per verification, accepted drafts and rounds per call observed
    # in the library's own calls, the design and its shortfalls (the suite's ``coverage``); None otherwise.
    coverage: dict[str, Any] | None = None

    @property
    def coverage_summary(self) -> str:
        return coverage_summary(self.coverage)


def coverage_summary(coverage: dict[str, Any] | None) -> str:
    """One line for tables: the most drafts a verification had, how many accepted all / some of >= 2
    drafts, the range of rounds per call, and "short" when the design was not reached."""
    if not coverage:
        return "-"
    drafts = [int(k) for k, v in coverage.get("drafts", {}).items() if v]
    rounds = [int(k) for k, v in coverage.get("rounds", {}).items() if v]
    text = (
        f"drafts<={max(drafts, default=0)} full {coverage.get('full', 0)} partial {coverage.get('partial', 0)} "
        f"rounds {min(rounds, default=0)}-{max(rounds, default=0)}"
    )
    return text + (" (short of design)" if coverage.get("shortfalls") else "")


@dataclass(frozen=True)
class RunDetail:
    id: int
    target: str
    sha: str
    branch: str | None
    branch_order: int | None
    profile: str
    status: RunStatus
    attempt: int
    device: str | None
    library_version: str | None
    torch_version: str | None
    python_version: str | None
    queued_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    cases: tuple[CaseRow, ...]
    purpose: str = "primary"
    # The run whose fingerprints ``same_as_previous`` compares with: the newest run with results of the same
    # profile on the nearest earlier commit of the branch.
    previous_run_id: int | None = None


def _case_row(result: CaseResult, previous: dict[str, str | None] | None = None) -> CaseRow:
    before = (previous or {}).get(result.case_id)
    same = None if not before or not result.fingerprint else before == result.fingerprint  # "": no output
    return CaseRow(
        case_id=result.case_id,
        verdict=result.verdict,
        lossless=result.lossless,
        conformance=result.conformance,
        n_trials=result.n_trials,
        e_value=result.e_value,
        log_e_value=result.log_e_value,
        threshold=result.threshold,
        tv_estimate=result.tv_estimate,
        tv_low=result.tv_low,
        tv_high=result.tv_high,
        acceptance_observed=result.acceptance_observed,
        acceptance_expected=result.acceptance_expected,
        fingerprint=result.fingerprint,
        duration_s=result.duration_s,
        same_as_previous=same,
        coverage=(result.details or {}).get("coverage"),
    )


def _previous_results(session: Session, run: Run, commit: Commit) -> int | None:
    """The newest run with results of ``run``'s profile on the nearest earlier commit of the branch."""
    if commit.branch_order is None:
        return None
    on_branch = Commit.branch.is_(None) if commit.branch is None else Commit.branch == commit.branch
    previous: int | None = session.scalar(
        select(Run.id)
        .join(Run.commit)
        .where(Commit.target_id == commit.target_id, on_branch, Commit.branch_order < commit.branch_order, Run.profile == run.profile)
        .where(select(CaseResult.id).where(CaseResult.run_id == Run.id).exists())
        .order_by(Commit.branch_order.desc(), Run.id.desc())
        .limit(1)
    )
    return previous


def run_detail(session: Session, run_id: int) -> RunDetail:
    """A run with its commit and every case result (by case id)."""
    found = session.execute(select(Run, Commit, Target.name).join(Run.commit).join(Commit.target).where(Run.id == run_id)).first()
    if found is None:
        raise NotFoundError(f"no run {run_id}")
    run, commit, target_name = found
    results = session.scalars(select(CaseResult).where(CaseResult.run_id == run.id).order_by(CaseResult.case_id))
    previous_run_id = _previous_results(session, run, commit)
    previous: dict[str, str | None] = {}
    if previous_run_id is not None:
        rows = session.execute(select(CaseResult.case_id, CaseResult.fingerprint).where(CaseResult.run_id == previous_run_id))
        previous = dict(rows.all())
    return RunDetail(
        id=run.id,
        target=target_name,
        sha=commit.sha,
        branch=commit.branch,
        branch_order=commit.branch_order,
        profile=run.profile,
        status=run.status,
        attempt=run.attempt,
        device=run.device,
        library_version=run.library_version,
        torch_version=run.torch_version,
        python_version=run.python_version,
        queued_at=run.queued_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        error=run.error,
        cases=tuple(_case_row(r, previous) for r in results),
        purpose=run.purpose.value,
        previous_run_id=previous_run_id,
    )


# --- one case over commits -------------------------------------------------------------------------------


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
    branch = _branch_of(target, branch)
    # The branch's newest ``limit`` commits first (index on target, branch, branch_order), then their runs and
    # this case's results (indexes on runs.commit_id and case_results(run_id, case_id)): the cost follows
    # ``limit``, not the length of the whole history.
    newest = (
        select(Commit.id)
        .where(Commit.target_id == target.id, Commit.branch == branch)
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
    points: dict[str, HistoryPoint] = {}
    for row in session.execute(query):
        if row.sha not in points:  # else an older run of the same commit
            points[row.sha] = HistoryPoint(**row._asdict())
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
        .where(Commit.target_id == target.id, Commit.branch == _branch_of(target, branch))
        .where(select(CaseResult.id).where(CaseResult.run_id == Run.id).exists())
        .order_by(Commit.branch_order.desc(), Run.id.desc())
        .limit(1)
    )
    if run_id is None:
        return []
    return list(session.scalars(select(CaseResult.case_id).where(CaseResult.run_id == run_id).order_by(CaseResult.case_id)))


# --- two commits compared --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseComparison:
    case_id: str
    verdict_a: Verdict | None
    verdict_b: Verdict | None
    log_e_value_a: float | None
    log_e_value_b: float | None
    acceptance_a: float | None
    acceptance_b: float | None
    # b - a, when both observed it.
    acceptance_difference: float | None
    # None when either side has no fingerprint.
    fingerprint_equal: bool | None
    changed: bool


@dataclass(frozen=True)
class Comparison:
    target: str
    sha_a: str
    sha_b: str
    run_a: int | None
    run_b: int | None
    cases: tuple[CaseComparison, ...]


def resolve_sha(session: Session, target: Target, sha: str) -> Commit:
    """The target's commit ``sha``, or the one commit whose sha starts with it (at least 4 characters)."""
    sha = sha.strip().lower()
    if len(sha) < SHA_PREFIX_MIN:
        raise QueryError(f"sha {sha!r} is too short: give at least {SHA_PREFIX_MIN} characters")
    exact = session.scalar(select(Commit).where(Commit.target_id == target.id, Commit.sha == sha))
    if exact is not None:
        return exact
    escaped = sha.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    found = list(session.scalars(select(Commit).where(Commit.target_id == target.id, Commit.sha.like(f"{escaped}%", escape="\\")).limit(2)))
    if not found:
        raise NotFoundError(f"target {target.name!r} has no commit {sha!r}")
    if len(found) > 1:
        raise QueryError(f"sha {sha!r} is ambiguous: give more characters")
    return found[0]


def _results_of(session: Session, run_id: int | None) -> dict[str, CaseResult]:
    if run_id is None:
        return {}
    return {r.case_id: r for r in session.scalars(select(CaseResult).where(CaseResult.run_id == run_id))}


def compare(session: Session, target_name: str, sha_a: str, sha_b: str) -> Comparison:
    """Per case (union of both latest runs), the verdicts, e-values, acceptance difference and fingerprint equality."""
    target = get_target(session, target_name)
    commit_a, commit_b = resolve_sha(session, target, sha_a), resolve_sha(session, target, sha_b)
    runs = _latest_runs(session, [commit_a.id, commit_b.id])
    run_a, run_b = runs.get(commit_a.id), runs.get(commit_b.id)
    results_a = _results_of(session, run_a.id if run_a else None)
    results_b = _results_of(session, run_b.id if run_b else None)
    cases = []
    for case_id in sorted(results_a.keys() | results_b.keys()):
        a, b = results_a.get(case_id), results_b.get(case_id)
        acc_a = a.acceptance_observed if a else None
        acc_b = b.acceptance_observed if b else None
        fp_a, fp_b = (a.fingerprint if a else None), (b.fingerprint if b else None)
        verdict_a, verdict_b = (a.verdict if a else None), (b.verdict if b else None)
        fingerprint_equal = None if fp_a is None or fp_b is None else fp_a == fp_b
        cases.append(
            CaseComparison(
                case_id=case_id,
                verdict_a=verdict_a,
                verdict_b=verdict_b,
                log_e_value_a=a.log_e_value if a else None,
                log_e_value_b=b.log_e_value if b else None,
                acceptance_a=acc_a,
                acceptance_b=acc_b,
                acceptance_difference=None if acc_a is None or acc_b is None else acc_b - acc_a,
                fingerprint_equal=fingerprint_equal,
                changed=verdict_a != verdict_b or fingerprint_equal is False,
            )
        )
    return Comparison(
        target=target.name,
        sha_a=commit_a.sha,
        sha_b=commit_b.sha,
        run_a=run_a.id if run_a else None,
        run_b=run_b.id if run_b else None,
        cases=tuple(cases),
    )


# --- operations ------------------------------------------------------------------------------------------


def runs_by_status(session: Session) -> dict[RunStatus, int]:
    """How many runs are in each status (every status present, zeros included)."""
    found = dict(session.execute(select(Run.status, func.count()).group_by(Run.status)).all())
    return {status: found.get(status, 0) for status in RunStatus}


# --- alerts ----------------------------------------------------------------------------------------------


class AlertStateError(QueryError):
    """The alert cannot move to the asked state (a resolved alert cannot be acknowledged)."""


@dataclass(frozen=True)
class AlertRow:
    id: int
    target: str
    branch: str
    kind: AlertKind
    state: AlertState
    first_bad_sha: str
    first_bad_order: int | None
    last_good_sha: str | None
    detected_run_id: int | None
    confirmation_run_id: int | None
    confirmed: bool
    bisection_runs: int
    cases: tuple[dict[str, Any], ...]
    summary: str | None
    created_at: datetime | None
    acknowledged_at: datetime | None
    resolved_at: datetime | None


def _alert_rows(session: Session, alerts: Sequence[Alert]) -> list[AlertRow]:
    commit_ids = {a.first_bad_commit_id for a in alerts} | {a.last_good_commit_id for a in alerts if a.last_good_commit_id}
    commits = {c.id: c for c in session.scalars(select(Commit).where(Commit.id.in_(commit_ids)))} if commit_ids else {}
    targets = dict(session.execute(select(Target.id, Target.name)).all()) if alerts else {}
    rows = []
    for alert in alerts:
        bad = commits[alert.first_bad_commit_id]
        good = commits.get(alert.last_good_commit_id) if alert.last_good_commit_id else None
        rows.append(
            AlertRow(
                id=alert.id,
                target=targets[alert.target_id],
                branch=alert.branch,
                kind=alert.kind,
                state=alert.state,
                first_bad_sha=bad.sha,
                first_bad_order=bad.branch_order,
                last_good_sha=good.sha if good else None,
                detected_run_id=alert.detected_run_id,
                confirmation_run_id=alert.confirmation_run_id,
                confirmed=alert.confirmed,
                bisection_runs=alert.bisection_runs,
                cases=tuple(alert.cases or ()),
                summary=alert.summary,
                created_at=alert.created_at,
                acknowledged_at=alert.acknowledged_at,
                resolved_at=alert.resolved_at,
            )
        )
    return rows


def list_alerts(
    session: Session,
    *,
    target: str | None = None,
    state: AlertState | None = None,
    kind: AlertKind | None = None,
    branch: str | None = None,
    limit: int = 100,
) -> list[AlertRow]:
    """Alerts, newest first, filtered by target, state, kind and branch."""
    if not 1 <= limit <= MAX_PAGE:
        raise QueryError(f"limit must be between 1 and {MAX_PAGE}")
    query = select(Alert).order_by(Alert.id.desc()).limit(limit)
    if target is not None:
        query = query.where(Alert.target_id == get_target(session, target).id)
    if state is not None:
        query = query.where(Alert.state == state)
    if kind is not None:
        query = query.where(Alert.kind == kind)
    if branch is not None:
        query = query.where(Alert.branch == branch)
    return _alert_rows(session, list(session.scalars(query)))


def get_alert(session: Session, alert_id: int) -> AlertRow:
    alert = session.get(Alert, alert_id)
    if alert is None:
        raise NotFoundError(f"no alert {alert_id}")
    return _alert_rows(session, [alert])[0]


def set_alert_state(session: Session, alert_id: int, state: AlertState, *, now: datetime) -> AlertRow:
    """Acknowledge (open → acknowledged) or resolve (open/acknowledged → resolved) an alert by hand.

    Asking for the state it is in is a no-op; acknowledging a resolved alert is an :class:`AlertStateError`.
    Flushes, never commits. Resolving by hand sends no message (the analysis worker's automatic resolution does).
    """
    alert = session.scalars(select(Alert).where(Alert.id == alert_id).with_for_update()).one_or_none()
    if alert is None:
        raise NotFoundError(f"no alert {alert_id}")
    if alert.state is not state:
        if state is AlertState.acknowledged:
            if alert.state is not AlertState.open:
                raise AlertStateError(f"alert {alert_id} is {alert.state.value}: only an open alert can be acknowledged")
            alert.acknowledged_at = now
        elif state is AlertState.resolved:
            alert.resolved_at = now
        else:
            raise AlertStateError(f"alert {alert_id} cannot be reopened by hand")
        alert.state = state
        session.flush()
    return _alert_rows(session, [alert])[0]


def alerts_by_state(session: Session) -> dict[tuple[AlertKind, AlertState], int]:
    """How many alerts of each kind are in each state (every pair present, zeros included)."""
    found = {
        (kind, state): count
        for kind, state, count in session.execute(select(Alert.kind, Alert.state, func.count()).group_by(Alert.kind, Alert.state))
    }
    return {(kind, state): found.get((kind, state), 0) for kind in AlertKind for state in AlertState}
