"""workers.task_base on the real Celery app and real Redis: one retry policy for every task, and messages
published only after the unit of work that asked for them commits."""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta

import celery.utils.time
import pytest
from celery.exceptions import Retry
from sqlalchemy import event, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.models import Target
from service.settings import get_settings
from tests.support.workers import queued_headers

# The module, not its tasks: pytest's collection would evaluate a task proxy, which configures the Celery app
# from this process's settings before the fixtures set them.
from workers import tasks
from workers.celery_app import ANALYSE_RUN, DELIVER_NOTIFICATIONS, POLL_BRANCHES, POLL_RELEASES, RUN_SUITE, SWEEP_RUNS, celery_config
from workers.settings import get_worker_settings
from workers.task_base import INFRASTRUCTURE_ERRORS, SpecwatchTask

pytestmark = pytest.mark.usefixtures("worker_env")


def messages(queue: str) -> list[tuple[str, list[int], int]]:
    """(task name, args, retries) of every message waiting in ``queue``, oldest first."""
    return [(h["task"], list(ast.literal_eval(h["argsrepr"])), h["retries"]) for h in queued_headers(queue)]


def nothing_published() -> bool:
    return messages("gpu") == [] and messages("default") == []


# --- publish after commit -------------------------------------------------------------------------------------


def test_tasks_requested_in_a_unit_of_work_are_published_once_after_it_commits(factory: sessionmaker[Session]) -> None:
    with session_scope(factory) as session:
        session.execute(select(Target.id)).all()
        tasks.analyse_run.publish_after_commit(session, 41)
        tasks.enqueue_after_commit(session, [7, 8])
        tasks.deliver_notifications.publish_after_commit(session)
        assert nothing_published()  # not before the commit

    assert messages("default") == [("workers.analyse_run", [41], 0), ("workers.deliver_notifications", [], 0)]
    assert messages("gpu") == [("workers.run_suite", [7], 0), ("workers.run_suite", [8], 0)]

    with session_scope(factory) as session:  # a later unit of work on the same factory sends nothing again
        session.execute(text("SELECT 1"))
    assert len(messages("default")) == 2
    assert len(messages("gpu")) == 2


def _request_then_fail(factory: sessionmaker[Session]) -> None:
    with session_scope(factory) as session:
        session.execute(select(Target.id)).all()
        tasks.analyse_run.publish_after_commit(session, 41)
        tasks.enqueue_after_commit(session, [7])
        raise RuntimeError("domain failure after the tasks were requested")


def test_tasks_requested_in_a_unit_of_work_that_rolls_back_are_never_published(factory: sessionmaker[Session]) -> None:
    with pytest.raises(RuntimeError, match="domain failure"):
        _request_then_fail(factory)

    assert nothing_published()
    with session_scope(factory) as session:  # nor by the session factory's next commit
        session.execute(text("SELECT 1"))
    assert nothing_published()


def _request(factory: sessionmaker[Session]) -> None:
    with session_scope(factory) as session:
        session.execute(select(Target.id)).all()
        tasks.analyse_run.publish_after_commit(session, 41)


def test_a_commit_that_fails_publishes_nothing(factory: sessionmaker[Session]) -> None:
    def database_gone(_: Session) -> None:
        raise OperationalError("COMMIT", {}, ConnectionResetError("server closed the connection"))

    event.listen(factory, "before_commit", database_gone)
    try:
        with pytest.raises(OperationalError):
            _request(factory)
    finally:
        event.remove(factory, "before_commit", database_gone)
    assert nothing_published()


# --- one retry policy ----------------------------------------------------------------------------------------


def test_every_task_has_the_one_retry_policy() -> None:
    routed = set(celery_config(get_settings(), get_worker_settings())["task_routes"])
    ours = {name: task for name, task in tasks.app.tasks.items() if name.startswith("workers.")}

    assert set(ours) == routed == {RUN_SUITE, SWEEP_RUNS, POLL_BRANCHES, POLL_RELEASES, ANALYSE_RUN, DELIVER_NOTIFICATIONS}
    for name, task in ours.items():
        assert isinstance(task, SpecwatchTask), name
        policy = (task.autoretry_for, task.max_retries, task.retry_backoff, task.retry_backoff_max, task.retry_jitter)
        assert policy == (INFRASTRUCTURE_ERRORS, 5, 2, 120, True), name
        assert hasattr(task, "_orig_run"), f"{name}: Celery's autoretry wrapper is not installed"


def _run_as_worker(task: SpecwatchTask, retries: int) -> None:
    """Run ``task`` as a worker would (a request that is not a direct call), ``retries`` retries in."""
    task.push_request(id=f"test-{retries}", retries=retries, called_directly=False, args=[], kwargs={})
    try:
        task.run()
    finally:
        task.pop_request()


def test_an_infrastructure_error_is_retried_later_with_backoff_through_the_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    def database_down(*_: object, **__: object) -> None:
        raise OperationalError("SELECT", {}, ConnectionRefusedError("connection refused"))

    monkeypatch.setattr(tasks, "sweep", database_down)
    monkeypatch.setattr(celery.utils.time.random, "randrange", lambda stop: stop - 1)  # the jitter's longest wait

    before = datetime.now(UTC)
    with pytest.raises(Retry):
        _run_as_worker(tasks.sweep_runs, retries=3)
    after = datetime.now(UTC)
    assert messages("default") == [("workers.sweep_runs", [], 4)]
    [message] = queued_headers("default")
    wait = timedelta(seconds=16)  # 2 s doubled three times
    assert before + wait <= datetime.fromisoformat(message["eta"]) <= after + wait

    with pytest.raises(OperationalError):  # the cap: the fifth retry was the last
        _run_as_worker(tasks.sweep_runs, retries=5)
    assert len(messages("default")) == 1


def test_a_domain_error_is_never_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(*_: object, **__: object) -> None:
        raise ValueError("a domain error")

    monkeypatch.setattr(tasks, "sweep", bug)

    with pytest.raises(ValueError, match="a domain error"):
        _run_as_worker(tasks.sweep_runs, retries=0)
    assert nothing_published()
