"""A bug that comes back after a fix is a new alert (issue 26): the analysis on stored runs, both backends.

Target ``lib`` on ``main``, case A. The story of issue 26: commit 1 passes, commit 2 fails (an alert, first
bad 2), commit 3 reverts it (passes: the alert resolves), commit 4 passes, commit 5 breaks it again. The
later failure's search runs between the newest passing commit (4) and commit 5, never answered by the first
streak; when the alert it names is a resolved one, it is reopened with a notification, never merged quietly.
Confirmation is off, so each primary run is decided on its own results; Slack is configured (outbox rows).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.models import Alert, AlertKind, AlertState, CaseResult, Commit, Notification, Run, RunPurpose, RunStatus, Verdict
from service.notifications.outbox import NotifyConfig
from tests.support.history import branch_commits
from workers.analysis import AnalysisConfig, analyse
from workers.analysis.decisions import Bisection, CommitOutcome, bisect

A = "direct/far_apart/V8/g1"
THRESHOLD = 1e4
CONFIG = AnalysisConfig(confirm_failures=False, notify=NotifyConfig(slack=True))
NOW = datetime(2026, 1, 1, tzinfo=UTC)
GOOD, BAD = CommitOutcome.GOOD, CommitOutcome.BAD


def _run(session: Session, commit: Commit, *, fails: bool, purpose: RunPurpose = RunPurpose.primary) -> int:
    run = Run(commit=commit, profile="quick", status=RunStatus.failed if fails else RunStatus.passed, purpose=purpose)
    session.add(run)
    session.flush()
    log_e = math.log(THRESHOLD) + 5.0 if fails else -1.0
    session.add(
        CaseResult(
            run_id=run.id,
            case_id=A,
            verdict=Verdict.FAIL if fails else Verdict.PASS,
            lossless=not fails,
            conformance=True,
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


def _slack(session: Session) -> list[tuple[str, int | None]]:
    return [(n.event, n.alert_id) for n in session.scalars(select(Notification).order_by(Notification.id))]


class TestBisectTheNewestStreak:
    """:func:`bisect` searches the newest streak of failures: after its newest good commit."""

    def test_a_fixed_earlier_streak_does_not_answer_for_a_later_one(self) -> None:
        commits = ["c1", "c2", "c3", "c4", "c5"]
        assert bisect(commits, {"c1": GOOD, "c2": BAD, "c3": GOOD, "c5": BAD}) == Bisection(None, "c4", "c3")
        assert bisect(commits, {"c1": GOOD, "c2": BAD, "c3": GOOD, "c4": GOOD, "c5": BAD}) == Bisection("c5", None, "c4")

    def test_a_standing_streak_is_searched_from_its_own_start(self) -> None:
        commits = ["c1", "c2", "c3", "c4"]
        assert bisect(commits, {"c1": GOOD, "c3": BAD, "c4": BAD}) == Bisection(None, "c2", "c1")
        assert bisect(commits, {"c2": BAD, "c3": GOOD, "c4": BAD}) == Bisection("c4", None, "c3")
        assert bisect(commits, {"c2": BAD, "c4": BAD}) == Bisection("c2", None, None)


def test_a_bug_back_after_a_revert_opens_a_new_alert(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib", 5)
        for commit, fails in zip(commits[:4], [False, True, False, False], strict=True):
            analyse(session, _run(session, commit, fails=fails), config=CONFIG, now=NOW)
        (first,) = _alerts(session)
        assert (first.state, first.first_bad_commit_id, first.resolved_by_commit_id) == (AlertState.resolved, commits[1].id, commits[2].id)

        report = analyse(session, _run(session, commits[4], fails=True), config=CONFIG, now=NOW)

        first, second = _alerts(session)
        assert report.opened == [second.id]
        assert first.state is AlertState.resolved
        assert (second.kind, second.state) == (AlertKind.violation, AlertState.open)
        assert (second.first_bad_commit_id, second.last_good_commit_id) == (commits[4].id, commits[3].id)
        assert _slack(session) == [("opened", first.id), ("resolved", first.id), ("opened", second.id)]


def test_the_bisection_of_a_new_streak_tests_the_untested_commit_after_the_fix(backend_factory: sessionmaker[Session]) -> None:
    """Commit 4 is pushed with 5 and has no run: the search queues it, never naming commit 2 (the old streak)."""
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib2", 5)
        for commit, fails in zip(commits[:3], [False, True, False], strict=True):
            analyse(session, _run(session, commit, fails=fails), config=CONFIG, now=NOW)
        detected = _run(session, commits[4], fails=True)

        (midpoint_id,) = analyse(session, detected, config=CONFIG, now=NOW).queued
        midpoint = session.get_one(Run, midpoint_id)
        assert (midpoint.commit_id, midpoint.purpose) == (commits[3].id, RunPurpose.bisection)
        midpoint.status = RunStatus.failed  # commit 4 is the first bad one
        session.add(CaseResult(run_id=midpoint_id, case_id=A, verdict=Verdict.FAIL, lossless=False, conformance=True, threshold=THRESHOLD))
        session.flush()
        analyse(session, midpoint_id, config=CONFIG, now=NOW)

        first, second = _alerts(session)
        assert first.state is AlertState.resolved
        assert (second.state, second.first_bad_commit_id, second.last_good_commit_id) == (AlertState.open, commits[3].id, commits[2].id)
        assert second.bisection_runs == 1


def test_a_resolved_alert_named_again_is_reopened_with_a_notification(backend_factory: sessionmaker[Session]) -> None:
    """Commit 3 passed by chance (the alert resolved); its re-run fails, and so does commit 4: the search names
    commit 2 again, and its resolved alert is reopened, visibly; it resolves again on a later pass."""
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib3", 5)
        for commit, fails in zip(commits[:3], [False, True, False], strict=True):
            analyse(session, _run(session, commit, fails=fails), config=CONFIG, now=NOW)
        (alert,) = _alerts(session)
        assert alert.state is AlertState.resolved
        analyse(session, _run(session, commits[2], fails=True, purpose=RunPurpose.bisection), config=CONFIG, now=NOW)

        report = analyse(session, _run(session, commits[3], fails=True), config=CONFIG, now=NOW)

        (alert,) = _alerts(session)
        assert (report.opened, report.reopened) == ([], [alert.id])
        assert (alert.state, alert.reopened_count, alert.resolved_at, alert.reopened_at) == (AlertState.open, 1, None, NOW)
        analyse(session, _run(session, commits[4], fails=False), config=CONFIG, now=NOW)
        assert alert.state is AlertState.resolved
        assert _slack(session) == [("opened", alert.id), ("resolved", alert.id), ("reopened", alert.id), ("resolved", alert.id)]
        keys = list(session.scalars(select(Notification.dedup_key).order_by(Notification.id)))
        assert keys[2:] == [f"alert:{alert.id}:reopened:1:slack", f"alert:{alert.id}:resolved:1:slack"]
