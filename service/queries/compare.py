"""Two commits compared case by case: verdicts, e-values, acceptance and output fingerprints."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import CaseResult, Commit, Target, Verdict
from service.queries.common import SHA_PREFIX_MIN, NotFoundError, QueryError, get_target, latest_runs


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
    runs = latest_runs(session, [commit_a.id, commit_b.id])
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
