"""A seeded history for the read side (API, CLI, dashboard): one target, one branch, a failure streak.

``main`` of target ``toy``: commits 1-3 pass, 4-5 fail (4 is the first failing commit; it was run twice,
an error then a failure), 6 passes again (the fix), 7 has a queued run, 8 has no run. Each finished run has
:data:`CASES`; the first one fails on 4 and 5, and the fix changes one fingerprint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from service.models import Alert, AlertKind, AlertState, CaseResult, Commit, Run, RunStatus, Target, Verdict

TARGET = "toy"
BRANCH = "main"
CASES = ("direct/far_apart/V8/g1", "direct/near/V8/g2", "e2e/assisted/top_k")
FAILING_CASE = CASES[0]
THRESHOLD = 3.0e4
FIRST_FAILING = 4
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def sha_of(order: int) -> str:
    return f"{order:02x}" + "c0ffee" * 6 + f"{order:02x}"[:2]


@dataclass
class Seeded:
    shas: dict[int, str] = field(default_factory=dict)  # branch order -> sha
    runs: dict[int, int] = field(default_factory=dict)  # branch order -> latest run id
    older_run: int = 0  # the first (error) run of commit 4
    open_alert: int = 0  # a violation first bad at commit 4
    resolved_alert: int = 0  # a resolved performance alert at commit 2


def case_result(run: Run, case_id: str, order: int, *, failing: bool) -> CaseResult:
    log_e = math.log(THRESHOLD) + 8.0 if failing else -1.0 + 0.1 * order
    return CaseResult(
        run=run,
        case_id=case_id,
        verdict=Verdict.FAIL if failing else Verdict.PASS,
        lossless=not failing,
        conformance=True,
        n_trials=20_000,
        e_value=math.exp(log_e),
        log_e_value=log_e,
        threshold=THRESHOLD,
        tv_estimate=0.09 if failing else 0.004,
        tv_low=0.07 if failing else 0.0,
        tv_high=0.11 if failing else 0.012,
        acceptance_observed=0.55 if failing else 0.71 + 0.001 * order,
        acceptance_expected=0.71,
        fingerprint=f"fp-{case_id}-{'bug' if failing else ('fix' if order >= 6 and case_id == CASES[2] else 'ok')}",
        duration_s=1.5,
        seed=order,
        device="cpu",
    )


def seed_history(session: Session) -> Seeded:
    """Add the history to ``session`` (flushed, not committed)."""
    seeded = Seeded()
    target = Target(
        name=TARGET, repo_url="https://github.com/octo-org/toy", adapter="toy_lib.sampler:speculative_sample", branches=[BRANCH]
    )
    session.add(target)
    session.flush()
    for order in range(1, 9):
        commit = Commit(
            target=target,
            sha=sha_of(order),
            branch=BRANCH,
            branch_order=order,
            author="Toy",
            committed_at=T0 + timedelta(hours=order),
            message=f"Commit number {order}\n\nbody",
        )
        session.add(commit)
        seeded.shas[order] = commit.sha
        if order == 8:
            continue
        if order == FIRST_FAILING:
            older = Run(commit=commit, profile="default", status=RunStatus.error, error="worker lost")
            session.add(older)
            session.flush()
            seeded.older_run = older.id
        failing = order in (4, 5)
        status = RunStatus.queued if order == 7 else (RunStatus.failed if failing else RunStatus.passed)
        run = Run(commit=commit, profile="default", status=status, device="cpu", library_version="0.1")
        session.add(run)
        if status is not RunStatus.queued:
            for case_id in CASES:
                session.add(case_result(run, case_id, order, failing=failing and case_id == FAILING_CASE))
        session.flush()
        seeded.runs[order] = run.id
    commit_ids = {c.branch_order: c.id for c in target.commits}
    violation = Alert(
        target_id=target.id,
        branch=BRANCH,
        first_bad_commit_id=commit_ids[FIRST_FAILING],
        last_good_commit_id=commit_ids[FIRST_FAILING - 1],
        kind=AlertKind.violation,
        detected_run_id=seeded.runs[FIRST_FAILING],
        confirmed=True,
        cases=[{"case_id": FAILING_CASE, "reason": "lossless"}],
        summary="losslessness violated",
    )
    performance = Alert(
        target_id=target.id,
        branch=BRANCH,
        first_bad_commit_id=commit_ids[2],
        kind=AlertKind.performance,
        state=AlertState.resolved,
        resolved_at=T0,
    )
    session.add_all([violation, performance])
    session.flush()
    seeded.open_alert, seeded.resolved_alert = violation.id, performance.id
    return seeded


def branch_commits(session: Session, name: str, count: int) -> list[Commit]:
    """A target ``name`` watching main and its first ``count`` commits there (sha ``i`` in hex, branch order ``i``), flushed."""
    target = Target(name=name, repo_url=f"https://github.com/acme/{name}", adapter="x", branches=["main"])
    commits = [Commit(target=target, sha=f"{i:040x}", branch="main", branch_order=i) for i in range(1, count + 1)]
    session.add_all(commits)
    session.flush()
    return commits
