"""One run with its case results, each compared with the previous tested run (:func:`service.history.previous_tested_run`)
and, when it failed, with the known finding that explains it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.history import previous_tested_run
from service.models import CaseResult, Commit, Run, RunStatus, Target, Verdict
from service.queries.common import NotFoundError
from service.queries.findings import FindingLink, FindingMatcher, commit_version, finding_matcher
from specwatch.report import coverage_summary


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
    # The known finding that explains this failure (service.queries.findings); None for a new failure or a pass.
    finding: FindingLink | None = None

    @property
    def coverage_summary(self) -> str:
        return coverage_summary(self.coverage)


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
    library_distribution: str | None
    torch_version: str | None
    python_version: str | None
    queued_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    cases: tuple[CaseRow, ...]
    purpose: str = "primary"
    # The run whose fingerprints ``same_as_previous`` compares with: the previous tested run
    # (:func:`service.history.previous_tested_run`), the one the analysis's ``unchanged_cases`` compares with.
    previous_run_id: int | None = None
    # Attempts that could not install the commit (each retried after a backoff; status uninstallable once spent).
    install_failures: int = 0
    # A re-run asked for by hand (service.reruns): why and by whom; None for runs queued by pushes, polls, analysis.
    rerun_reason: str | None = None
    rerun_by: str | None = None
    # The end of the suite's output (stderr, at most the worker's log_tail_chars); None when it wrote nothing.
    log_tail: str | None = None
    # The attempt could not use the target's repository (a configuration error of the target, not of the commit).
    configuration_error: bool = False
    # The run could not test its commit for a reason that is not its code (the commit missing, a checkout or mirror
    # failure, the worker crashed or lost): never a broken commit.
    infrastructure_error: bool = False
    # The last exception a worker raised on the run, recorded when raised (also while the run is retried):
    # {"attempt", "type", "message", "where"}; None when no attempt raised.
    worker_exception: dict[str, Any] | None = None


def _case_row(result: CaseResult, previous: dict[str, str | None] | None = None, finding: FindingLink | None = None) -> CaseRow:
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
        finding=finding if result.verdict is Verdict.FAIL else None,
    )


def _findings(matcher: FindingMatcher, commit: Commit, run: Run, failed: list[str]) -> dict[str, FindingLink]:
    if not matcher or not failed:
        return {}
    version = commit_version(commit.sha, run.library_version)
    return matcher.match_all(
        failed, version=version, distribution=run.library_distribution, branch=commit.branch, branch_order=commit.branch_order
    )


def run_detail(session: Session, run_id: int) -> RunDetail:
    """A run with its commit and every case result (by case id)."""
    found = session.execute(select(Run, Commit, Target.name).join(Run.commit).join(Commit.target).where(Run.id == run_id)).first()
    if found is None:
        raise NotFoundError(f"no run {run_id}")
    run, commit, target_name = found
    results = list(session.scalars(select(CaseResult).where(CaseResult.run_id == run.id).order_by(CaseResult.case_id)))
    matcher = finding_matcher(session, commit.target_id)
    findings = _findings(matcher, commit, run, [r.case_id for r in results if r.verdict is Verdict.FAIL])
    previous = previous_tested_run(session, commit, run.profile)
    previous_run_id = previous.id if previous is not None else None
    fingerprints: dict[str, str | None] = {}
    if previous_run_id is not None:
        rows = session.execute(select(CaseResult.case_id, CaseResult.fingerprint).where(CaseResult.run_id == previous_run_id))
        fingerprints = dict(rows.all())
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
        library_distribution=run.library_distribution,
        torch_version=run.torch_version,
        python_version=run.python_version,
        queued_at=run.queued_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        error=run.error,
        cases=tuple(_case_row(r, fingerprints, findings.get(r.case_id)) for r in results),
        purpose=run.purpose.value,
        previous_run_id=previous_run_id,
        install_failures=run.install_failures,
        rerun_reason=run.rerun_reason,
        rerun_by=run.rerun_by,
        log_tail=run.log_tail,
        configuration_error=run.configuration_error,
        infrastructure_error=run.infrastructure_error,
        worker_exception=run.worker_exception,
    )
