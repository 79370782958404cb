"""Only the code under test makes a broken commit (issue 42, items 2 and 3).

A worker's own exception is on the run at once (type, message, where) while the run is retried, and the final error
names it; a commit the repository lacks is an error on its run, never a page about the commit, and a target-level
alert only once such errors persist. Real worker tasks, real git, real PostgreSQL; Slack is configured (the outbox
rows are what would be sent).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.auth import hash_token
from service.db import session_scope
from service.models import Alert, AlertKind, AlertState, Notification, Run, RunStatus
from service.queries.operations import run_durations
from service.settings import Settings
from tests.support.toy_target import ADAPTER, CORRECT, ToyRepo
from tests.support.workers import REDIS_URL, WEBHOOK_SECRET, add_runs, clear_caches

# The module, not its tasks (see test_tasks.py).
from workers import tasks
from workers.analysis.configuration import PERSISTING_RUNS
from workers.runs import RunOutcome, claim_run, record_crash, record_outcome, renew_lease, sweep

pytestmark = pytest.mark.usefixtures("worker_env")

TOKEN = "infrastructure-test-token"


class NoProducer:
    def send_run(self, run_id: int) -> None:
        raise AssertionError(f"nothing should be enqueued (run {run_id})")


@pytest.fixture
def client(database_url: str, factory: sessionmaker[Session]) -> TestClient:
    settings = Settings(
        env="test", database_url=database_url, redis_url=REDIS_URL, webhook_secret=WEBHOOK_SECRET, api_token_hashes=[hash_token(TOKEN)]
    )
    return TestClient(create_app(settings, session_factory=factory, producer=NoProducer()))


@pytest.fixture
def slack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECWATCH_SLACK_WEBHOOK_URL", "http://127.0.0.1:9/never-called")
    clear_caches()


def alerts(factory: sessionmaker[Session]) -> list[Alert]:
    with factory() as session:
        return list(session.scalars(select(Alert).order_by(Alert.id)))


def slack_rows(factory: sessionmaker[Session]) -> list[tuple[str, int | None]]:
    with factory() as session:
        return [(n.event, n.alert_id) for n in session.scalars(select(Notification).where(Notification.channel == "slack"))]


def load(factory: sessionmaker[Session], run_id: int) -> Run:
    with factory() as session:
        return session.get_one(Run, run_id)


@pytest.mark.usefixtures("slack")
def test_a_worker_exception_is_on_the_run_at_once_and_the_final_error_names_it(
    factory: sessionmaker[Session], toy_repo: ToyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: TestClient
) -> None:
    """The worker cannot make its scratch folder (a file stands where the folder should be): each attempt raises in
    the worker's own code. Before issue 42 the run showed ``running``, ``error: null`` until its lease expired, and
    ended "worker killed, out of memory, or machine lost" with a broken-commit alert for a good commit."""
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("SPECWATCH_WORKER_SCRATCH_DIR", str(blocked))
    clear_caches()
    (run_id,) = add_runs(factory, toy_repo.url, [toy_repo.commit(CORRECT, "good")], adapter=ADAPTER, max_attempts=2)

    first = tasks.run_suite(run_id)

    assert first["status"] == "crashed"
    run = load(factory, run_id)
    assert run.status is RunStatus.queued  # queued again at once: the sweeper sends it on its next pass
    assert run.worker_exception is not None
    assert run.worker_exception["attempt"] == 1
    assert run.worker_exception["type"] == "NotADirectoryError"
    assert "Not a directory" in run.worker_exception["message"]
    assert run.worker_exception["where"].startswith("workers/execution.py:")
    assert " in _attempt via pathlib" in run.worker_exception["where"]
    answer = client.get(f"/runs/{run_id}")  # while the run is still retrying
    assert answer.status_code == 200
    shown = answer.json()
    assert shown["status"] == "queued"
    assert shown["worker_exception"] == run.worker_exception
    assert shown["error"].startswith("attempt 1 of 2 raised NotADirectoryError: [Errno 20] Not a directory")
    assert shown["error"].endswith("; queued again")

    second = tasks.run_suite(run_id)

    assert second["status"] == "error"
    run = load(factory, run_id)
    assert (run.status, run.attempt, run.infrastructure_error) == (RunStatus.error, 2, True)
    assert run.error is not None
    assert run.error.startswith("gave up after 2 of 2 attempts: attempt 2 raised NotADirectoryError: [Errno 20] Not a directory")
    assert "worker killed" not in run.error
    assert tasks.analyse_run(run_id)["kind"] is None
    assert alerts(factory) == []
    assert slack_rows(factory) == []


def test_worker_lost_only_when_no_exception_was_recorded(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    """Attempt 1 raised, attempt 2's worker vanished: the final error names the exception and the lost attempt."""
    (crashing, lost) = add_runs(
        factory, toy_repo.url, [toy_repo.commit(CORRECT, f"commit {i}") for i in range(2)], adapter=ADAPTER, max_attempts=2
    )
    now = datetime.now(UTC)
    raised = {"attempt": 1, "type": "KeyError", "message": "'x'", "where": "workers/execution.py:1 in _attempt"}
    with session_scope(factory) as session:
        for run_id in (crashing, lost):
            claim_run(session, run_id, worker="host:1", now=now, lease_s=30)
        assert record_crash(session, crashing, 1, raised, now=now) is RunStatus.queued
    later = now + timedelta(seconds=60)
    with session_scope(factory) as session:
        for run_id in (crashing, lost):
            claim_run(session, run_id, worker="host:2", now=later, lease_s=30)
    with session_scope(factory) as session:  # both workers die: their leases expire
        assert sorted(sweep(session, now=later + timedelta(seconds=31), queued_lease_s=900).gave_up) == sorted([crashing, lost])

    crashed_run, lost_run = load(factory, crashing), load(factory, lost)
    assert crashed_run.error is not None
    assert crashed_run.error.startswith(
        "gave up after 2 of 2 attempts: attempt 1 raised KeyError: 'x' (at workers/execution.py:1 in _attempt)"
    )
    assert "attempt 2 stopped renewing its lease on host:2" in crashed_run.error
    assert lost_run.error is not None
    assert "worker killed, out of memory, or machine lost" in lost_run.error
    assert crashed_run.infrastructure_error
    assert lost_run.infrastructure_error


@pytest.mark.usefixtures("slack")
def test_a_commit_the_repository_lacks_is_an_error_on_its_run_and_a_target_alert_only_once_it_persists(
    factory: sessionmaker[Session], toy_repo: ToyRepo
) -> None:
    """A signed push whose ``after`` the repository lacks (``"b" * 40``) queues a run whose checkout cannot find the
    commit. Before issue 42: a broken-commit alert and a Slack page about that commit."""
    good = toy_repo.commit(CORRECT, "good")
    missing = ["b" * 40, "c" * 40, "d" * 40]
    assert len(missing) == PERSISTING_RUNS
    run_ids = add_runs(factory, toy_repo.url, [*missing, good], adapter=ADAPTER)

    for count, run_id in enumerate(run_ids[:-1], start=1):
        assert tasks.run_suite(run_id)["status"] == "error"
        run = load(factory, run_id)
        assert (
            run.error
            == f"checkout failed: commit {missing[count - 1]} does not exist in {toy_repo.url} (not found after fetching every ref)"
        )
        assert run.infrastructure_error
        report = tasks.analyse_run(run_id)
        if count < PERSISTING_RUNS:  # alone, an error on its run: nobody is paged
            assert report["kind"] is None
            assert alerts(factory) == []
            assert slack_rows(factory) == []

    assert report["kind"] == "configuration"  # it persists: the target's one alert, never a broken commit
    (alert,) = alerts(factory)
    assert (alert.kind, alert.state) == (AlertKind.configuration, AlertState.open)
    assert f"commit {missing[-1]} does not exist" in alert.cases[0]["error"]
    assert slack_rows(factory) == [("opened", alert.id)]

    assert tasks.run_suite(run_ids[-1])["status"] == "passed"
    tasks.analyse_run(run_ids[-1])

    (alert,) = alerts(factory)
    assert alert.state is AlertState.resolved
    assert not [a for a in alerts(factory) if a.kind is AlertKind.broken]


def test_run_durations_count_every_attempt(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    """Attempt 1 raised after 50 s, attempt 2's worker vanished 50 s after its claim (its last heartbeat), attempt
    3 passed in 30 s: the run took 130 s of work, not the last attempt's 30 s (issue 42, item 9)."""
    (run_id,) = add_runs(factory, toy_repo.url, [toy_repo.commit(CORRECT, "good")], adapter=ADAPTER, max_attempts=3)
    t0 = datetime.now(UTC) - timedelta(hours=1)
    raised = {"attempt": 1, "type": "OSError", "message": "disk full", "where": "workers/execution.py:1 in _attempt"}
    with session_scope(factory) as session:
        claim_run(session, run_id, worker="host:1", now=t0, lease_s=30)
    with session_scope(factory) as session:
        record_crash(session, run_id, 1, raised, now=t0 + timedelta(seconds=50))
    with session_scope(factory) as session:
        claim_run(session, run_id, worker="host:2", now=t0 + timedelta(seconds=100), lease_s=30)
    with session_scope(factory) as session:
        assert renew_lease(session, run_id, 2, now=t0 + timedelta(seconds=150), lease_s=30)
    with session_scope(factory) as session:
        assert sweep(session, now=t0 + timedelta(seconds=190), queued_lease_s=900).requeued == [run_id]
    with session_scope(factory) as session:
        claim_run(session, run_id, worker="host:3", now=t0 + timedelta(seconds=300), lease_s=30)
    with session_scope(factory) as session:
        assert record_outcome(session, run_id, 3, RunOutcome(RunStatus.passed), now=t0 + timedelta(seconds=330))

    with factory() as session:
        passed = run_durations(session)["passed"]

    assert passed.count == 1
    assert passed.total == pytest.approx(130)
