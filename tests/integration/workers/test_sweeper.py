"""workers.sweep_runs called directly: real PostgreSQL, messages really published to Redis."""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.models import Run, RunStatus
from tests.support.toy_target import ADAPTER, CORRECT, ToyRepo
from tests.support.workers import add_runs, queued_headers

# The module, not its tasks: pytest's collection would evaluate a task proxy, which configures the Celery app
# from this process's settings before the fixtures set them.
from workers import tasks
from workers.runs import claim_run

pytestmark = pytest.mark.usefixtures("worker_env")


def queued_messages(queue: str = "gpu") -> list[tuple[str, list[int]]]:
    """(task name, args) of every message waiting in ``queue``, oldest first."""
    return [(m["task"], list(ast.literal_eval(m["argsrepr"]))) for m in queued_headers(queue)]


def set_run(factory: sessionmaker[Session], run_id: int, **values: object) -> None:
    with session_scope(factory) as session:
        session.execute(update(Run).where(Run.id == run_id).values(**values))


def load(factory: sessionmaker[Session], run_id: int) -> Run:
    with factory() as session:
        return session.get_one(Run, run_id)


@pytest.fixture
def run_ids(factory: sessionmaker[Session], toy_repo: ToyRepo) -> list[int]:
    shas = [toy_repo.commit(CORRECT, f"commit {i}") for i in range(4)]
    return add_runs(factory, toy_repo.url, shas, adapter=ADAPTER, max_attempts=2)


def test_stale_queued_runs_are_enqueued_again_once_per_lease(factory: sessionmaker[Session], run_ids: list[int]) -> None:
    now = datetime.now(UTC)
    lost, fresh, never_sent, _ = run_ids
    set_run(factory, lost, lease_expires_at=now - timedelta(seconds=1))  # enqueue failed (Redis down)
    set_run(factory, fresh, lease_expires_at=now + timedelta(minutes=10))  # just queued
    set_run(factory, never_sent, queued_at=now - timedelta(hours=1))  # no lease at all: queued_at decides

    report = tasks.sweep_runs()

    assert report == {"requeued": [lost, never_sent], "gave_up": []}
    assert queued_messages() == [("workers.run_suite", [lost]), ("workers.run_suite", [never_sent])]
    assert load(factory, lost).status == RunStatus.queued
    lease = load(factory, lost).lease_expires_at
    assert lease is not None
    assert lease > now + timedelta(minutes=10)
    assert tasks.sweep_runs() == {"requeued": [], "gave_up": []}  # the new lease holds until the next deadline


def test_running_runs_whose_lease_expired_are_requeued_then_given_up(factory: sessionmaker[Session], run_ids: list[int]) -> None:
    dead, alive, *_ = run_ids
    now = datetime.now(UTC)
    for run_id in run_ids:
        set_run(factory, run_id, lease_expires_at=now + timedelta(minutes=10))
    with session_scope(factory) as session:
        claim_run(session, dead, worker="gone:1", now=now - timedelta(minutes=5), lease_s=60)
        claim_run(session, alive, worker="busy:2", now=now, lease_s=600)

    assert tasks.sweep_runs() == {"requeued": [dead], "gave_up": []}
    run = load(factory, dead)
    assert (run.status, run.attempt) == (RunStatus.queued, 1)
    assert run.error == "attempt 1 lost: gone:1 stopped renewing its lease; re-queued"
    assert load(factory, alive).status == RunStatus.running
    assert queued_messages() == [("workers.run_suite", [dead])]

    # Its second (and last) attempt dies too.
    with session_scope(factory) as session:
        claim_run(session, dead, worker="gone:3", now=now - timedelta(minutes=2), lease_s=60)
    assert tasks.sweep_runs() == {"requeued": [], "gave_up": [dead]}
    run = load(factory, dead)
    assert (run.status, run.attempt) == (RunStatus.error, 2)
    assert run.error is not None
    assert run.error.startswith("gave up after 2 of 2 attempts: each worker stopped renewing its lease")
    assert "gone:3" in run.error
    assert run.finished_at is not None
    assert run.lease_expires_at is None
    assert tasks.sweep_runs() == {"requeued": [], "gave_up": []}


def test_finished_runs_are_never_swept(factory: sessionmaker[Session], run_ids: list[int]) -> None:
    long_ago = datetime.now(UTC) - timedelta(days=1)
    for run_id, status in zip(run_ids, [RunStatus.passed, RunStatus.failed, RunStatus.error, RunStatus.cancelled], strict=True):
        set_run(factory, run_id, status=status, queued_at=long_ago, lease_expires_at=long_ago)

    assert tasks.sweep_runs() == {"requeued": [], "gave_up": []}
    assert queued_messages() == []
