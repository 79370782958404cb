"""A standing failure does not hide a later regression: analysis on stored runs (no suite executed).

Target ``lib`` on ``main``: commit 1 passes cases A and B; commit 2 fails A (an alert, first bad 2);
commit 3 fails A and, newly, B; commit 4 fails A only; commit 5 passes both. Confirmation is off, so
each primary run is decided on its own results.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.models import Alert, AlertKind, AlertState, CaseResult, Commit, Notification, Run, RunPurpose, RunStatus, Target, Verdict
from service.notifications.outbox import NotifyConfig
from service.queries import list_alerts
from tests.support.history import branch_commits
from workers.analysis import AnalysisConfig, analyse

A, B = "direct/far_apart/V8/g1", "direct/far_apart/V8/g3"
THRESHOLD = 1e4
CONFIG = AnalysisConfig(confirm_failures=False)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _run(session: Session, commit: Commit, failing: set[str], *, lossless: bool = False) -> int:
    run = Run(commit=commit, profile="quick", status=RunStatus.failed if failing else RunStatus.passed)
    session.add(run)
    session.flush()
    for case_id in (A, B):
        fails = case_id in failing
        log_e = math.log(THRESHOLD) + 5.0 if fails else -1.0
        session.add(
            CaseResult(
                run_id=run.id,
                case_id=case_id,
                verdict=Verdict.FAIL if fails else Verdict.PASS,
                lossless=lossless if fails else True,
                conformance=not fails if lossless else True,
                n_trials=10_000,
                e_value=math.exp(log_e),
                log_e_value=log_e,
                threshold=THRESHOLD,
            )
        )
    session.flush()
    return run.id


def _alerts(session: Session) -> list[Alert]:
    return list(session.scalars(select(Alert).order_by(Alert.id)))


def test_a_new_failure_beside_a_standing_one_gets_its_own_alert(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        target = Target(name="lib", repo_url="https://github.com/acme/lib", adapter="x", branches=["main"])
        commits = [Commit(target=target, sha=f"{i:040x}", branch="main", branch_order=i) for i in range(1, 6)]
        session.add_all(commits)
        session.flush()
        history = [set(), {A}, {A, B}, {A}, set()]
        reports = [analyse(session, _run(session, c, failing), config=CONFIG, now=NOW) for c, failing in zip(commits, history, strict=True)]

        first, second = _alerts(session)
        assert (first.kind, first.first_bad_commit_id, [e["case_id"] for e in first.cases]) == (AlertKind.violation, commits[1].id, [A])
        # Without setting A aside, commit 2 would count as bad for B too and B would merge into the first alert.
        assert (second.kind, second.first_bad_commit_id, [e["case_id"] for e in second.cases]) == (AlertKind.violation, commits[2].id, [B])
        assert second.last_good_commit_id == commits[1].id
        assert (reports[2].kind, reports[3].kind) == ("violation", None)  # commit 4: A is known, nothing new
        runs = {r.id: r for r in session.scalars(select(Run))}
        analysis_3 = runs[reports[2].run_id].analysis or {}
        analysis_4 = runs[reports[3].run_id].analysis or {}
        assert (analysis_3["failing"], analysis_3["known_failing"]) == ([B], [A])
        assert (analysis_4["failing"], analysis_4["known_failing"]) == ([], [A])
        # Commit 5 passes both: both alerts resolve.
        assert {a.state for a in _alerts(session)} == {AlertState.resolved}


def test_a_known_conformance_failure_turning_lossy_is_new(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        target = Target(name="lib2", repo_url="https://github.com/acme/lib2", adapter="x", branches=["main"])
        commits = [Commit(target=target, sha=f"{i:040x}", branch="main", branch_order=i) for i in range(1, 4)]
        session.add_all(commits)
        session.flush()
        analyse(session, _run(session, commits[0], set()), config=CONFIG, now=NOW)
        analyse(session, _run(session, commits[1], {A}, lossless=True), config=CONFIG, now=NOW)  # conformance only
        analyse(session, _run(session, commits[2], {A}), config=CONFIG, now=NOW)  # now lossless too

        performance, violation = _alerts(session)
        assert (performance.kind, performance.first_bad_commit_id) == (AlertKind.performance, commits[1].id)
        assert (violation.kind, violation.first_bad_commit_id) == (AlertKind.violation, commits[2].id)


def test_a_known_lossless_failure_covers_its_conformance_only_failures(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib3", 3)
        analyse(session, _run(session, commits[0], set()), config=CONFIG, now=NOW)
        analyse(session, _run(session, commits[1], {A}), config=CONFIG, now=NOW)  # lossless: an alert
        report = analyse(session, _run(session, commits[2], {A}, lossless=True), config=CONFIG, now=NOW)  # conformance only
        assert report.kind is None
        assert len(_alerts(session)) == 1


def test_certain_failures_are_confirmed(backend_factory: sessionmaker[Session]) -> None:
    """A deterministic check's failure has no finite e-value (log E None): its rerun confirms it."""
    with session_scope(backend_factory) as session:
        (commit,) = branch_commits(session, "lib4", 1)
        run_id = _run(session, commit, {A})
        for case in session.scalars(select(CaseResult).where(CaseResult.run_id == run_id, CaseResult.case_id == A)):
            case.log_e_value = None
        (confirmation_id,) = analyse(session, run_id, config=AnalysisConfig(), now=NOW).queued
        confirmation = session.get_one(Run, confirmation_id)
        confirmation.status = RunStatus.failed
        session.add(
            CaseResult(run_id=confirmation_id, case_id=A, verdict=Verdict.FAIL, lossless=False, conformance=False, threshold=THRESHOLD)
        )
        session.flush()
        analyse(session, confirmation_id, config=AnalysisConfig(), now=NOW)
        (alert,) = _alerts(session)
        assert (alert.kind, alert.confirmed) == (AlertKind.violation, True)


def test_a_search_does_not_wait_on_another_run_of_its_midpoint(backend_factory: sessionmaker[Session]) -> None:
    """Commit 2's own (primary) run is still queued when commit 3's failure is bisected: the search queues
    its own run of commit 2 rather than wait for one whose analysis would never resume it."""
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib5", 3)
        analyse(session, _run(session, commits[0], set()), config=CONFIG, now=NOW)
        queued = Run(commit=commits[1], profile="quick", status=RunStatus.queued)
        session.add(queued)
        session.flush()
        report = analyse(session, _run(session, commits[2], {A}), config=CONFIG, now=NOW)
        (child_id,) = report.queued
        child = session.get_one(Run, child_id)
        assert (child.commit_id, child.purpose, child.parent_run_id) == (commits[1].id, RunPurpose.bisection, report.run_id)


def test_a_known_failure_keeps_the_status_failed_when_a_new_one_is_not_confirmed(backend_factory: sessionmaker[Session]) -> None:
    config = AnalysisConfig(confirm_failures=True, notify=NotifyConfig(github=True))
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib6", 3)
        analyse(session, _run(session, commits[0], set()), config=CONFIG, now=NOW)
        analyse(session, _run(session, commits[1], {A}), config=CONFIG, now=NOW)  # A: an alert
        primary = _run(session, commits[2], {A, B})  # A known, B new
        (confirmation_id,) = analyse(session, primary, config=config, now=NOW).queued
        session.get_one(Run, confirmation_id).status = RunStatus.failed
        for case_id in (A, B):  # the rerun fails A again but not B: B is not confirmed
            fails = case_id == A
            session.add(
                CaseResult(
                    run_id=confirmation_id,
                    case_id=case_id,
                    verdict=Verdict.FAIL if fails else Verdict.PASS,
                    lossless=not fails,
                    conformance=True,
                    log_e_value=math.log(THRESHOLD) + 5 if fails else -1.0,
                    threshold=THRESHOLD,
                )
            )
        session.flush()
        analyse(session, confirmation_id, config=config, now=NOW)
        events = list(session.scalars(select(Notification.event).where(Notification.run_id == primary).order_by(Notification.id)))
        assert events == ["confirming", "failure"]
        assert len(_alerts(session)) == 1


def _raise_in(session: Session, run_id: int, case_id: str, error: str = "RuntimeError: probability tensor contains inf") -> None:
    """Make ``case_id`` of run ``run_id`` a case whose target raised on a valid input (a failing case, layers unmeasured)."""
    case = session.scalars(select(CaseResult).where(CaseResult.run_id == run_id, CaseResult.case_id == case_id)).one()
    case.verdict, case.lossless, case.conformance = Verdict.FAIL, None, None
    case.details = {"failure": "raised", "reason": f"{error}\nTraceback ..."}
    session.get_one(Run, run_id).status = RunStatus.failed
    session.flush()


def test_a_case_that_raised_beside_a_lossy_one_is_alerted_then_set_aside(backend_factory: sessionmaker[Session]) -> None:
    """Commit 2: A lossy and B raised: both are new and both are in the alert (B was in neither ``failing`` nor
    ``known_failing``). Commits 3 and 4 fail the same way: nothing new, both known (an exception counted as new at
    every commit). Commit 5: B alone raises, A passes: still known, nothing new."""
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib7", 5)
        analyse(session, _run(session, commits[0], set()), config=CONFIG, now=NOW)
        reports = []
        for commit, failing in zip(commits[1:], [{A, B}, {A, B}, {A, B}, {B}], strict=True):
            run_id = _run(session, commit, failing)
            _raise_in(session, run_id, B)
            reports.append(analyse(session, run_id, config=CONFIG, now=NOW))

        (alert,) = _alerts(session)
        assert (alert.kind, alert.first_bad_commit_id) == (AlertKind.violation, commits[1].id)
        assert [(e["case_id"], e["reason"]) for e in alert.cases] == [(A, "lossless"), (B, "raised")]
        assert [r.kind for r in reports] == ["violation", None, None, None]
        runs = {r.id: r for r in session.scalars(select(Run))}
        analyses = [runs[r.run_id].analysis or {} for r in reports]
        assert (analyses[0]["failing"], analyses[0]["known_failing"]) == ([A, B], [])
        assert [(a["failing"], a["known_failing"]) for a in analyses[1:]] == [([], [A, B]), ([], [A, B]), ([], [B])]


def test_an_exception_alert_is_not_new_at_every_commit(backend_factory: sessionmaker[Session]) -> None:
    """A case that raised opens an EXCEPTION alert once; the same case raising at later commits is known."""
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib8", 4)
        analyse(session, _run(session, commits[0], set()), config=CONFIG, now=NOW)
        kinds = []
        for commit in commits[1:]:
            run_id = _run(session, commit, {A})
            _raise_in(session, run_id, A)
            kinds.append(analyse(session, run_id, config=CONFIG, now=NOW).kind)
        assert kinds == ["exception", None, None]
        (alert,) = _alerts(session)
        assert (alert.kind, alert.first_bad_commit_id, alert.state) == (AlertKind.exception, commits[1].id, AlertState.open)


def test_a_known_lossy_case_that_now_raises_is_new(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib9", 3)
        analyse(session, _run(session, commits[0], set()), config=CONFIG, now=NOW)
        analyse(session, _run(session, commits[1], {A}), config=CONFIG, now=NOW)
        run_id = _run(session, commits[2], {A})
        _raise_in(session, run_id, A)
        assert analyse(session, run_id, config=CONFIG, now=NOW).kind == "exception"


def _fail_as(session: Session, run_id: int, *, certain: bool, tv: tuple[float, float], check: str = "lossless/pos1") -> None:
    """Give case A of run ``run_id`` a failure signature: its headline check, certain or statistical, its TV interval."""
    case = session.scalars(select(CaseResult).where(CaseResult.run_id == run_id, CaseResult.case_id == A)).one()
    case.verdict, case.lossless, case.conformance = Verdict.FAIL, False, False
    case.tv_low, case.tv_high = tv
    case.details = {"headline": check, "certain": ["lossless"] if certain else [], "failure": "lossless"}
    if certain:
        case.log_e_value = None
    session.get_one(Run, run_id).status = RunStatus.failed
    session.flush()


def _primary(session: Session, commit: Commit, **signature: Any) -> int:
    run_id = _run(session, commit, {A})
    _fail_as(session, run_id, **signature)
    return run_id


CERTAIN = {"certain": True, "tv": (0.01, 0.2)}
STATISTICAL = {"certain": False, "tv": (0.40, 0.52)}


def _bisect_at(session: Session, report_queued: list[int], commit: Commit, **signature: Any) -> list[int]:
    """Finish the search's queued run of ``commit`` with ``signature`` (or passing when empty) and analyse it."""
    (run_id,) = report_queued
    run = session.get_one(Run, run_id)
    assert (run.commit_id, run.purpose) == (commit.id, RunPurpose.bisection)
    for case_id in (A, B):
        session.add(CaseResult(run_id=run_id, case_id=case_id, verdict=Verdict.PASS, lossless=True, conformance=True, threshold=THRESHOLD))
    run.status = RunStatus.passed
    session.flush()
    if signature:
        _fail_as(session, run_id, **signature)
    return analyse(session, run_id, config=CONFIG, now=NOW).queued


@pytest.mark.parametrize(("at_3", "first_bad"), [(CERTAIN, 4), (STATISTICAL, 3)])
def test_a_new_failure_of_a_case_already_failing_is_its_own_regression(
    backend_factory: sessionmaker[Session], at_3: dict[str, Any], first_bad: int
) -> None:
    """The issue's replay: A fails with a certain violation from commit 2; commit 4 (commit 3 not tested) fails it
    statistically with a TV interval far from the first one, a new bug in the same case. It was set aside as
    "already in the open alert" (matched by case and reason). Now it is a new regression, searched within the range
    where A was already failing: commit 3 failing the old way makes 4 the first bad commit, failing the new way 3."""
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, f"lib-sig-{first_bad}", 5)
        analyse(session, _run(session, commits[0], set()), config=CONFIG, now=NOW)
        analyse(session, _primary(session, commits[1], **CERTAIN), config=CONFIG, now=NOW)
        report = analyse(session, _primary(session, commits[3], **STATISTICAL), config=CONFIG, now=NOW)
        assert report.kind == "violation"
        analysis = session.get_one(Run, report.run_id).analysis or {}
        assert (analysis["failing"], analysis["known_failing"]) == ([A], [])
        assert analysis["supersedes"][A]["evidence"] == "certain"
        assert _bisect_at(session, report.queued, commits[2], **at_3) == []

        old, new = _alerts(session)
        assert (new.kind, new.first_bad_commit_id) == (AlertKind.violation, commits[first_bad - 1].id)
        # The old failure ended where the new one began: its case is fixed there, failing as the new alert now.
        assert old.first_bad_commit_id == commits[1].id
        assert (old.state, old.resolved_by_commit_id) == (AlertState.resolved, commits[first_bad - 1].id)
        (ended,) = old.cases
        assert (ended.get("fixed_sha"), ended.get("now_fails_as")) == (commits[first_bad - 1].sha, {"alert": new.id})
        assert new.last_good_commit_id == commits[first_bad - 2].id  # failing the old way: good for this search
        (found,) = new.cases
        assert (found["signature"]["evidence"], found["signature"]["tv"], found["supersedes"]["evidence"]) == (
            "statistical",
            [0.40, 0.52],
            "certain",
        )
        # Commit 5 fails either way: both signatures are known (the old one as the one the open alert replaced).
        for signature in (CERTAIN, STATISTICAL, {"certain": False, "tv": (0.45, 0.6)}):
            assert analyse(session, _primary(session, commits[4], **signature), config=CONFIG, now=NOW).kind is None


def test_the_same_failure_with_an_overlapping_interval_stays_known(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib-sig-same", 4)
        analyse(session, _run(session, commits[0], set()), config=CONFIG, now=NOW)
        analyse(session, _primary(session, commits[1], certain=False, tv=(0.1, 0.3)), config=CONFIG, now=NOW)
        assert analyse(session, _primary(session, commits[2], certain=False, tv=(0.25, 0.35)), config=CONFIG, now=NOW).kind is None
        # Another check (another position) of the same layer is another failure.
        other = analyse(
            session, _primary(session, commits[3], certain=False, tv=(0.25, 0.35), check="lossless/pos4"), config=CONFIG, now=NOW
        )
        assert other.kind == "violation"


def test_each_case_of_an_alert_is_fixed_at_its_own_commit(backend_factory: sessionmaker[Session]) -> None:
    """A and B fail from commit 2; commit 3 fixes A (B still fails), commit 4 fixes B. The fix of A was silent (the
    alert resolved only when every case passed in one run): it is now "fixed at" commit 3 in the alert, Slack and
    the API, and the alert resolves at commit 4, its last case's fix."""
    config = AnalysisConfig(confirm_failures=False, notify=NotifyConfig(slack=True))
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib-fix", 4)
        for commit, failing in zip(commits, [set(), {A, B}, {B}, set()], strict=True):
            analyse(session, _run(session, commit, failing), config=config, now=NOW)
        (alert,) = _alerts(session)
        fixes = {e["case_id"]: (e.get("fixed_sha"), e.get("fixed_order")) for e in alert.cases}
        assert fixes == {A: (commits[2].sha, 3), B: (commits[3].sha, 4)}
        assert (alert.state, alert.resolved_by_commit_id) == (AlertState.resolved, commits[3].id)
        messages = list(session.scalars(select(Notification).where(Notification.alert_id == alert.id).order_by(Notification.id)))
        assert [m.event for m in messages] == ["opened", "fixed", "resolved"]
        fixed_text = str(messages[1].payload)
        assert f"`{A}` fixed at `{commits[2].sha[:12]}`" in fixed_text
        assert B not in fixed_text.split("fixed at", maxsplit=1)[0]  # B is not announced as fixed at commit 3
        assert "1 case of this alert still fail" in fixed_text
        assert f"`{B}` fixed at `{commits[3].sha[:12]}`" in str(messages[2].payload)
        (row,) = list_alerts(session, target="lib-fix")
        assert row.resolved_sha == commits[3].sha
        assert [c.get("fixed_sha") for c in row.cases] == [commits[2].sha, commits[3].sha]


def test_a_fixed_case_that_fails_again_is_no_longer_fixed(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib-refail", 4)
        for commit, failing in zip(commits, [set(), {A, B}, {B}, {A, B}], strict=True):
            analyse(session, _run(session, commit, failing), config=CONFIG, now=NOW)
        (alert,) = _alerts(session)
        assert [e.get("fixed_sha") for e in alert.cases] == [None, None]
        assert alert.state is AlertState.open


def _confirm(session: Session, confirmation_id: int, **signature: Any) -> Any:
    """Finish the confirmation run ``confirmation_id`` failing A with ``signature`` and analyse it."""
    run = session.get_one(Run, confirmation_id)
    assert run.purpose is RunPurpose.confirmation
    for case_id in (A, B):
        session.add(
            CaseResult(run_id=confirmation_id, case_id=case_id, verdict=Verdict.PASS, lossless=True, conformance=True, threshold=THRESHOLD)
        )
    session.flush()
    _fail_as(session, confirmation_id, **signature)
    return analyse(session, confirmation_id, config=AnalysisConfig(), now=NOW)


def test_a_new_failure_whose_primary_run_was_triaged_before_the_standing_alert_opened_is_still_its_own(
    backend_factory: sessionmaker[Session],
) -> None:
    """The replay of real transformers releases (4.40.2, 4.41.2, 4.45.2 through `specwatch serve`): 4.41.2's primary run
    was analysed before 4.40.2's confirmation opened its alert, so its triage saw no alert, gave its failure no
    ``supersedes``, and the search for it met 4.40.2 failing (the old way) and named 4.40.2: the alert already
    there, nothing new, the new bug never alerted. The confirmation now triages again against the alerts standing
    then: the new signature supersedes the standing one, and the search names its own commit."""
    config = AnalysisConfig()
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib-race", 3)
        analyse(session, _run(session, commits[0], set()), config=config, now=NOW)
        (first_confirmation,) = analyse(session, _primary(session, commits[1], **CERTAIN), config=config, now=NOW).queued
        (second_confirmation,) = analyse(session, _primary(session, commits[2], **STATISTICAL), config=config, now=NOW).queued
        _confirm(session, first_confirmation, **CERTAIN)
        (old,) = _alerts(session)
        assert old.first_bad_commit_id == commits[1].id
        _confirm(session, second_confirmation, **STATISTICAL)
        old, new = _alerts(session)
        assert (new.kind, new.first_bad_commit_id, new.last_good_commit_id) == (AlertKind.violation, commits[2].id, commits[1].id)
        (found,) = new.cases
        assert (found["signature"]["evidence"], found["supersedes"]["evidence"]) == ("statistical", "certain")


def test_a_failure_alerted_meanwhile_with_the_same_signature_opens_nothing_more(backend_factory: sessionmaker[Session]) -> None:
    config = AnalysisConfig()
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib-race-same", 3)
        analyse(session, _run(session, commits[0], set()), config=config, now=NOW)
        (first_confirmation,) = analyse(session, _primary(session, commits[1], **STATISTICAL), config=config, now=NOW).queued
        (second_confirmation,) = analyse(session, _primary(session, commits[2], **STATISTICAL), config=config, now=NOW).queued
        _confirm(session, first_confirmation, **STATISTICAL)
        _confirm(session, second_confirmation, **STATISTICAL)
        (alert,) = _alerts(session)
        assert alert.first_bad_commit_id == commits[1].id


def test_fixes_analysed_before_their_alert_opened_are_reported_when_it_opens(backend_factory: sessionmaker[Session]) -> None:
    """The replay of transformers 4.40.2, 4.41.2, 4.45.2 through `specwatch serve`: every commit's primary run came before
    the first one's confirmation, so 4.45.2 (the case passing again) was analysed while no alert stood, and the alert
    opened afterwards never heard of the fix. An alert now reads the later commits' runs as it opens: A fixed at
    commit 3, B at commit 4, the alert resolved by commit 4 (Slack: "opened", then "resolved")."""
    config = AnalysisConfig(notify=NotifyConfig(slack=True))
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib-late-fix", 4)
        analyse(session, _run(session, commits[0], set()), config=config, now=NOW)
        (confirmation_id,) = analyse(session, _run(session, commits[1], {A, B}), config=config, now=NOW).queued
        for commit, failing in ((commits[2], {B}), (commits[3], set())):
            analyse(session, _run(session, commit, failing), config=config, now=NOW)  # before any alert stands
        assert _alerts(session) == []
        confirmation = session.get_one(Run, confirmation_id)
        confirmation.status = RunStatus.failed
        for case_id in (A, B):
            session.add(
                CaseResult(
                    run_id=confirmation_id,
                    case_id=case_id,
                    verdict=Verdict.FAIL,
                    lossless=False,
                    conformance=False,
                    n_trials=10_000,
                    log_e_value=math.log(THRESHOLD) + 5.0,
                    e_value=THRESHOLD * math.exp(5.0),
                    threshold=THRESHOLD,
                )
            )
        session.flush()
        analyse(session, confirmation_id, config=config, now=NOW)
        (alert,) = _alerts(session)
        fixes = {e["case_id"]: (e.get("fixed_sha"), e.get("fixed_order")) for e in alert.cases}
        assert fixes == {A: (commits[2].sha, 3), B: (commits[3].sha, 4)}
        assert (alert.state, alert.resolved_by_commit_id) == (AlertState.resolved, commits[3].id)
        messages = list(session.scalars(select(Notification.event).where(Notification.alert_id == alert.id).order_by(Notification.id)))
        assert messages == ["opened", "resolved"]  # one analysis: the fixes and the resolution reported together


def test_the_replayed_history_alerts_each_bug_at_its_commit_and_each_fix(backend_factory: sessionmaker[Session]) -> None:
    """The replay of transformers 4.40.2, 4.41.2, 4.45.2 as `specwatch serve` ran it: the three primary runs first
    (A fails certainly, then statistically, then passes), then the confirmations. The first alert opens at commit 1
    and, reading commit 3's pass, resolves at once; commit 2's failure stood inside it, so it is a new failure of A
    (another signature): its own alert at commit 2, last good commit 1, fixed by commit 3 as well."""
    config = AnalysisConfig()
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib-replay", 3)
        (first,) = analyse(session, _primary(session, commits[0], **CERTAIN), config=config, now=NOW).queued
        (second,) = analyse(session, _primary(session, commits[1], **STATISTICAL), config=config, now=NOW).queued
        assert analyse(session, _run(session, commits[2], set()), config=config, now=NOW).kind is None
        _confirm(session, first, **CERTAIN)
        (old,) = _alerts(session)
        assert (old.first_bad_commit_id, old.state, old.resolved_by_commit_id) == (commits[0].id, AlertState.resolved, commits[2].id)
        _confirm(session, second, **STATISTICAL)
        old, new = _alerts(session)
        assert (new.first_bad_commit_id, new.last_good_commit_id) == (commits[1].id, commits[0].id)
        # Not reopened by the failure of another signature: its failure ended where that one began (commit 2).
        assert (old.state, old.resolved_by_commit_id) == (AlertState.resolved, commits[1].id)
        assert [(e.get("fixed_sha"), e.get("now_fails_as")) for e in old.cases] == [(commits[1].sha, {"alert": new.id})]
        (found,) = new.cases
        assert (found["signature"]["evidence"], found["supersedes"]["evidence"], found["fixed_sha"]) == (
            "statistical",
            "certain",
            commits[2].sha,
        )
        assert (new.state, new.resolved_by_commit_id) == (AlertState.resolved, commits[2].id)


def test_the_commit_status_of_a_passing_fix_says_fixed_here(backend_factory: sessionmaker[Session]) -> None:
    """Issue 37: a fix is an event on the commit too. The passing run that fixes an alert's last cases posts the status
    "fixed" (success, "fixed here") after its plain "success"; a failing run that fixes some cases keeps "failure"."""
    config = AnalysisConfig(confirm_failures=False, notify=NotifyConfig(github=True))
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib-fix-status", 4)
        runs = []
        for commit, failing in zip(commits, [set(), {A, B}, {B}, set()], strict=True):  # each commit's run analysed in turn
            runs.append(_run(session, commit, failing))
            analyse(session, runs[-1], config=config, now=NOW)
        statuses = session.scalars(select(Notification).where(Notification.channel == "github").order_by(Notification.id)).all()
        by_run = {run_id: [(n.event, n.payload["state"]) for n in statuses if n.run_id == run_id] for run_id in runs}
        assert by_run == {
            runs[0]: [("success", "success")],
            runs[1]: [("failure", "failure")],
            runs[2]: [("failure", "failure")],  # A fixed here, B still failing: the commit still fails
            runs[3]: [("success", "success"), ("fixed", "success")],
        }
        (fixed,) = [n for n in statuses if n.event == "fixed"]
        assert fixed.payload["description"] == "specwatch: quick run passed; fixed here: cases of an alert pass again"
        assert fixed.payload["sha"] == commits[3].sha
