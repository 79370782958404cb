"""The notification outbox against local stand-ins for Slack and GitHub: each message arrives exactly once.

Slack answers 429 with Retry-After, then 500 for a while, then 200; the sender never sleeps: a fake clock
moves to each row's next_attempt_at between passes.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db import make_engine, session_scope
from service.models import (
    Alert,
    AlertKind,
    CaseResult,
    Commit,
    Notification,
    NotificationStatus,
    Run,
    RunPurpose,
    RunStatus,
    Target,
    Verdict,
)
from service.notifications.github import queue_commit_status
from service.notifications.outbox import NotifyConfig
from service.notifications.slack import queue_alert_message, slack_message
from tests.support.http_fakes import block_kit_problems, fake_server
from workers.analysis import AnalysisConfig, analyse
from workers.notify import deliver_due
from workers.senders import Channels

SLACK_PATH = "/services/T000/B000/secret-part"
TOKEN = "ghp_super-secret-token"


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make_alert(session: Session, cases: int) -> Alert:
    target = Target(name="transformers", repo_url="https://github.com/huggingface/transformers", adapter="transformers", branches=["main"])
    commit = Commit(target=target, sha="a" * 40, branch="main", branch_order=1)
    entries = [
        {
            "case_id": f"e2e/assistant/case{i:04d}/" + "x" * 60,
            "reason": "lossless",
            "e_value": 1e9,
            "log_e_value": 20.7,
            "threshold": 1.2e5,
            "tv_estimate": 0.05,
            "acceptance_observed": 0.3,
            "acceptance_expected": 0.31,
        }
        for i in range(cases)
    ]
    alert = Alert(target=target, branch="main", first_bad_commit=commit, kind=AlertKind.violation, cases=entries, confirmed=True)
    alert.summary = "losslessness violation"
    session.add(alert)
    session.flush()
    return alert


def rows(factory: sessionmaker[Session]) -> list[Notification]:
    with factory() as session:
        return list(session.scalars(select(Notification).order_by(Notification.id)))


def drain(factory: sessionmaker[Session], channels: Channels, clock: Clock, passes: int = 30) -> None:
    """Deliver, then move the clock to the earliest next try; until nothing is due or left."""
    for _ in range(passes):
        deliver_due(factory, channels, now=clock, limit=10)
        waiting = [r.next_attempt_at for r in rows(factory) if r.status != NotificationStatus.sent and r.next_attempt_at]
        if not waiting:
            return
        clock.now = max(clock.now, min(waiting))


def test_each_slack_message_arrives_exactly_once(
    backend_factory: sessionmaker[Session], clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    script = [(429, {"Retry-After": "7"})] + [(500, {})] * 3 + [(200, {})]
    with fake_server(script, check_block_kit=True) as server:
        channels = Channels(slack_webhook_url=server.url + SLACK_PATH, github_token=None, backoff_s=5, backoff_max_s=60)
        with session_scope(backend_factory) as session:
            alert = make_alert(session, cases=1000)  # far more cases than 50 blocks of 3000 characters hold
            assert queue_alert_message(session, NotifyConfig(slack=True), alert, "opened") == 1
            assert queue_alert_message(session, NotifyConfig(slack=True), alert, "opened") == 0  # dedup key
            queue_alert_message(session, NotifyConfig(slack=True), alert, "resolved")
        caplog.set_level("DEBUG")

        first = deliver_due(backend_factory, channels, now=clock, limit=10)
        assert first.deferred == [rows(backend_factory)[0].id]  # 429 on the first message
        (opened, _resolved) = rows(backend_factory)
        assert opened.status is NotificationStatus.pending
        assert opened.next_attempt_at == clock.now + timedelta(seconds=7)  # Retry-After honoured, not slept
        drain(backend_factory, channels, clock)

        delivered = [r for r in server.requests if r.status == 200]
        assert len(delivered) == 2  # each message exactly once
        assert [r.status for r in server.requests] == [429, 500, 500, 500, 200, 200]
        assert all(r.path == SLACK_PATH for r in server.requests)
        for request in delivered:
            assert block_kit_problems(request.body) == []
        (body,) = [r.body for r in delivered if not r.body["text"].startswith("Resolved")]
        assert body["blocks"][0]["type"] == "header"
        text = str(body)
        assert "transformers" in text
        assert "https://github.com/huggingface/transformers/commit/" + "a" * 40 in text
        assert "e-value" in text
        assert "TV" in text
        assert "acceptance" in text
        assert "confirmed by a second run" in text
        assert "more cases on the dashboard" in text
        assert sum(r.body["text"].startswith("Resolved") for r in delivered) == 1
        assert all(r.status is NotificationStatus.sent for r in rows(backend_factory))
        assert sum(r.attempts for r in rows(backend_factory)) == 6  # 429, 3 x 500 and 2 x 200 between them
        again = deliver_due(backend_factory, channels, now=clock, limit=10)
        assert again.sent == []
        assert len(server.requests) == 6
    assert "secret-part" not in caplog.text
    assert all("secret-part" not in (r.last_error or "") for r in rows(backend_factory))


def test_slack_down_keeps_the_message_and_backs_off(backend_factory: sessionmaker[Session], clock: Clock) -> None:
    channels = Channels(slack_webhook_url="http://127.0.0.1:9/services/unreachable", github_token=None, backoff_s=10, backoff_max_s=40)
    with session_scope(backend_factory) as session:
        queue_alert_message(session, NotifyConfig(slack=True), make_alert(session, cases=1), "opened")
    delays = []
    for _ in range(4):
        deliver_due(backend_factory, channels, now=clock, limit=10)
        (row,) = rows(backend_factory)
        assert row.status is NotificationStatus.failed
        assert row.next_attempt_at is not None
        delays.append((row.next_attempt_at - clock.now).total_seconds())
        clock.now = row.next_attempt_at
    assert delays == [10, 20, 40, 40]  # exponential, capped
    assert "unreachable" not in (row.last_error or "")


def test_github_commit_statuses(backend_factory: sessionmaker[Session], clock: Clock) -> None:
    with fake_server([(500, {}), (201, {})]) as github:
        channels = Channels(slack_webhook_url=None, github_token=TOKEN, github_api_url=github.url, backoff_s=1)
        config = NotifyConfig(github=True, dashboard_url="https://specwatch.example.com")
        with session_scope(backend_factory) as session:
            target = Target(name="lib", repo_url="https://github.com/acme/lib.git", adapter="x", branches=["main"])
            run = Run(commit=Commit(target=target, sha="b" * 40, branch="main", branch_order=1), profile="quick", status=RunStatus.failed)
            session.add(run)
            session.flush()
            assert queue_commit_status(session, config, run, "pending") == 1
            assert queue_commit_status(session, config, run, "failure") == 1
            run_id = run.id
        drain(backend_factory, channels, clock)

    assert [(r.status, r.body["state"] if r.body else None) for r in github.requests] == [
        (500, "failure"),
        (201, "failure"),
    ]  # the stale pending is never posted
    request = github.requests[-1]
    assert request.path == "/repos/acme/lib/statuses/" + "b" * 40
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.body["target_url"] == f"https://specwatch.example.com/ui/runs/{run_id}"
    assert request.body["context"] == "specwatch/quick"
    pending, failure = rows(backend_factory)
    assert (pending.status, pending.last_error) == (NotificationStatus.failed, "superseded by a newer commit status")
    assert failure.status is NotificationStatus.sent
    assert all(TOKEN not in (r.last_error or "") for r in rows(backend_factory))


def test_a_runs_statuses_are_sent_in_order_by_two_senders(database_url: str, clock: Clock) -> None:
    """Issue 42: while one sender is posting a run's ``pending`` (its row locked), another must not post the run's
    newer ``failure`` first (GitHub keeps the last one posted): it waits, and goes out once the older is done."""
    engine = make_engine(database_url)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    try:
        with fake_server([(201, {})] * 3) as github:
            channels = Channels(slack_webhook_url=None, github_token=TOKEN, github_api_url=github.url)
            config = NotifyConfig(github=True, dashboard_url="https://specwatch.example.com")
            with session_scope(factory) as session:
                target = Target(name="lib", repo_url="https://github.com/acme/lib.git", adapter="x", branches=["main"])
                run = Run(commit=Commit(target=target, sha="b" * 40, branch="main", branch_order=1), profile="quick")
                session.add(run)
                session.flush()
                assert queue_commit_status(session, config, run, "pending") == 1
                assert queue_commit_status(session, config, run, "failure") == 1
            with factory() as first_sender:  # has taken the pending row and is posting it
                pending = first_sender.scalars(select(Notification).order_by(Notification.id).limit(1).with_for_update()).one()
                report = deliver_due(factory, channels, now=clock, limit=10)
                assert github.requests == []  # the failure waited for the pending in flight
                assert report.sent == report.given_up == []
                pending.status = NotificationStatus.sent
                first_sender.commit()
            report = deliver_due(factory, channels, now=clock, limit=10)
        assert [r.body["state"] for r in github.requests if r.body] == ["failure"]
        assert [r.status for r in rows(factory)] == [NotificationStatus.sent, NotificationStatus.sent]
    finally:
        engine.dispose()


def test_no_commit_status_without_a_token_or_for_other_hosts(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        target = Target(name="lib2", repo_url="/srv/git/lib", adapter="x", branches=["main"])
        run = Run(commit=Commit(target=target, sha="c" * 40, branch="main", branch_order=1), profile="quick")
        session.add(run)
        session.flush()
        assert queue_commit_status(session, NotifyConfig(github=True), run, "pending") == 0
        assert queue_commit_status(session, NotifyConfig(github=False), run, "pending") == 0


@pytest.mark.parametrize("purpose", [RunPurpose.confirmation, RunPurpose.bisection])
def test_only_primary_runs_post_commit_statuses(backend_factory: sessionmaker[Session], purpose: RunPurpose) -> None:
    """A confirmation run (same commit) or a bisection run would overwrite the commit's real status."""
    with session_scope(backend_factory) as session:
        target = Target(name="lib3", repo_url="https://github.com/acme/lib3", adapter="x", branches=["main"])
        commit = Commit(target=target, sha="d" * 40, branch="main", branch_order=1)
        primary = Run(commit=commit, profile="quick", status=RunStatus.failed)
        session.add(primary)
        session.flush()
        child = Run(commit=commit, profile="quick", purpose=purpose, parent_run_id=primary.id)
        session.add(child)
        session.flush()
        config = NotifyConfig(github=True)
        assert queue_commit_status(session, config, child, "pending") == 0
        assert queue_commit_status(session, config, child, "failure") == 0
        assert queue_commit_status(session, config, primary, "failure") == 1
        with pytest.raises(ValueError, match="unknown commit status"):
            queue_commit_status(session, config, primary, "done")


def _failing_primary(session: Session, name: str) -> Run:
    target = Target(name=name, repo_url=f"https://github.com/acme/{name}", adapter="x", branches=["main"])
    run = Run(commit=Commit(target=target, sha="e" * 40, branch="main", branch_order=1), profile="quick", status=RunStatus.failed)
    session.add(run)
    session.flush()
    _result(session, run, log_e=math.log(1e4) + 3.0)
    return run


def _result(session: Session, run: Run, *, log_e: float) -> None:
    failing = log_e >= math.log(1e4)
    session.add(
        CaseResult(
            run_id=run.id,
            case_id="direct/far_apart/V8/g1",
            verdict=Verdict.FAIL if failing else Verdict.PASS,
            lossless=not failing,
            conformance=True,
            n_trials=10_000,
            e_value=math.exp(log_e),
            log_e_value=log_e,
            threshold=1e4,
        )
    )
    session.flush()


def _statuses(session: Session, run_id: int) -> list[tuple[str, str, str]]:
    rows = session.scalars(select(Notification).where(Notification.run_id == run_id).order_by(Notification.id))
    return [(r.event, r.payload["state"], r.payload["description"]) for r in rows]


@pytest.mark.parametrize(
    ("again_log_e", "final"),
    [
        (-1.0, ("not-confirmed", "success", "specwatch: quick passed: the first run's rejection was not confirmed by a rerun")),
        (math.log(1e4) + 2.0, ("confirmed", "failure", "specwatch: quick run failed, confirmed by a rerun with fresh seeds")),
    ],
    ids=["not-confirmed", "confirmed"],
)
def test_a_failing_run_shows_pending_until_its_confirmation_decides(
    backend_factory: sessionmaker[Session], again_log_e: float, final: tuple[str, str, str]
) -> None:
    """The commit is not marked failed on the first run's word: ``pending`` while the rerun confirms, then
    ``failure`` if it does, ``success`` if it does not (the rerun itself posts nothing)."""
    config = AnalysisConfig(notify=NotifyConfig(github=True))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    with session_scope(backend_factory) as session:
        primary = _failing_primary(session, f"lib-{final[0]}")
        report = analyse(session, primary.id, config=config, now=now)
        (confirmation_id,) = report.queued
        assert _statuses(session, primary.id) == [
            ("confirming", "pending", "specwatch: quick run failed; confirming with fresh seeds before alerting")
        ]
        confirmation = session.get_one(Run, confirmation_id)
        assert confirmation.purpose is RunPurpose.confirmation
        confirmation.status = RunStatus.failed if again_log_e > 0 else RunStatus.passed
        _result(session, confirmation, log_e=again_log_e)
        analyse(session, confirmation_id, config=config, now=now)
        assert _statuses(session, primary.id)[1:] == [final]
        assert _statuses(session, confirmation_id) == []


def test_an_error_alert_message_links_its_run_and_log_and_a_capped_e_value_says_so() -> None:
    """Issue 26: a broken-commit alert's message shows the error and links the run's log; an e-value past the cap is
    not shown as 1e+300."""
    target = Target(name="toy", repo_url="https://github.com/octo-org/toy", adapter="toy:f", branches=["main"])
    commit = Commit(target=target, sha="b" * 40, branch="main", branch_order=3)
    broken = Alert(
        id=7,
        target=target,
        branch="main",
        first_bad_commit=commit,
        kind=AlertKind.broken,
        detected_run_id=41,
        cases=[{"case_id": "(suite)", "reason": "broken", "error": "ImportError: no module named toy_lib"}],
    )
    text = json.dumps(slack_message(broken, "opened", "http://dash.example"))
    assert "ImportError: no module named toy_lib" in text
    assert "<http://dash.example/ui/runs/41#log|run 41 and its log>" in text
    assert "<http://dash.example/ui/alerts/7|Open on the dashboard>" in text
    capped = Alert(
        id=8,
        target=target,
        branch="main",
        first_bad_commit=commit,
        kind=AlertKind.violation,
        cases=[{"case_id": "direct/x", "reason": "lossless", "e_value": 1e300, "log_e_value": 2118.3, "threshold": 2e5}],
    )
    text = json.dumps(slack_message(capped, "opened", "http://dash.example"))
    assert "1e+300" not in text
    assert "e-value capped" in text
    assert "run 8 and its log" not in text
