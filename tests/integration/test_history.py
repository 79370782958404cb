"""One answer to "the previous tested run", shared by the run page and the analysis (``service.history``).

Branch ``main`` of ``lib``: commit 1 has a passed run; commit 2 a failed primary run and, newer, its
confirmation (fresh seeds); commit 3 an ``error`` run with partial results and a passed run of another
profile; commit 4 the run asked about. Its previous tested run is commit 2's primary run: the error run
is not tested, the other profile's run is another test, and the confirmation run re-tests the commit
whose own run is the primary one.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.history import previous_tested_run
from service.models import CaseResult, Commit, Run, RunPurpose, RunStatus, Target, Verdict
from service.queries import run_detail
from workers.analysis import AnalysisConfig, analyse
from workers.analysis.state import BisectionStateError

X, Y = "direct/far_apart/V8/g1", "direct/near/V8/g2"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _run(session: Session, commit: Commit, status: RunStatus, fingerprints: dict[str, str], **fields: object) -> Run:
    run = Run(commit=commit, profile=str(fields.pop("profile", "quick")), status=status, finished_at=NOW, **fields)
    session.add(run)
    session.flush()
    for case_id, fingerprint in fingerprints.items():
        verdict = Verdict.FAIL if status is RunStatus.failed else Verdict.PASS
        session.add(CaseResult(run_id=run.id, case_id=case_id, verdict=verdict, lossless=True, conformance=True, fingerprint=fingerprint))
    session.flush()
    return run


def _branch(session: Session) -> list[Commit]:
    target = Target(name="lib", repo_url="https://github.com/acme/lib", adapter="x", branches=["main"])
    commits = [Commit(target=target, sha=f"{i:040x}", branch="main", branch_order=i) for i in range(1, 5)]
    session.add_all(commits)
    session.flush()
    return commits


def test_the_run_page_and_the_analysis_compare_with_the_same_previous_tested_run(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        c1, c2, c3, c4 = _branch(session)
        _run(session, c1, RunStatus.passed, {X: "x-old", Y: "y-old"})
        primary = _run(session, c2, RunStatus.failed, {X: "x", Y: "y-2"})
        _run(session, c2, RunStatus.passed, {X: "x-fresh", Y: "y"}, purpose=RunPurpose.confirmation, parent_run_id=primary.id)
        _run(session, c3, RunStatus.error, {X: "x-partial", Y: "y"})
        _run(session, c3, RunStatus.passed, {X: "x-other", Y: "y"}, profile="full")
        current = _run(session, c4, RunStatus.passed, {X: "x", Y: "y"})
        previous = previous_tested_run(session, c4, "quick")
        assert previous is not None
        assert previous.id == primary.id
        ids = {"primary": primary.id, "current": current.id}
    with session_scope(backend_factory) as session:
        detail = run_detail(session, ids["current"])
        assert detail.previous_run_id == ids["primary"]
        assert {c.case_id: c.same_as_previous for c in detail.cases} == {X: True, Y: False}
        report = analyse(session, ids["current"], config=AnalysisConfig(confirm_failures=False), now=NOW)
        assert report.outcome == "analysed"
    with session_scope(backend_factory) as session:
        analysed = session.get_one(Run, ids["current"])
        assert analysed.analysis is not None
        assert analysed.analysis["unchanged_cases"] == [X]


def test_the_first_commit_of_a_branch_has_no_previous_tested_run(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        c1, *_ = _branch(session)
        run = _run(session, c1, RunStatus.passed, {X: "x"})
        assert previous_tested_run(session, c1, "quick") is None
        assert run_detail(session, run.id).previous_run_id is None


def test_a_bisection_run_whose_search_state_is_malformed_is_refused_naming_the_run(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        c1, c2, *_ = _branch(session)
        detected = _run(
            session, c2, RunStatus.failed, {X: "x"}, analysis={"kind": "violation", "bisection": {"version": 9, "kind": "violation"}}
        )
        bisection = _run(session, c1, RunStatus.passed, {X: "x"}, purpose=RunPurpose.bisection, parent_run_id=detected.id)
        ids = (detected.id, bisection.id)
    with session_scope(backend_factory) as session, pytest.raises(BisectionStateError, match=rf"^run {ids[0]}: .* is version 9"):
        analyse(session, ids[1], config=AnalysisConfig(), now=NOW)
