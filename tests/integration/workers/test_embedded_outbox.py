"""``specwatch serve``'s outbox thread and restart (issue 26, item 6), on the embedded default's SQLite and kombu's
in-memory broker, against a local stand-in for GitHub's statuses API.

No Celery worker runs here: the embedded worker takes one task at a time, and a suite run holds it for minutes, so a
delivery must not need it. The thread alone sends a status written when a run is queued (its ``pending``), and one
asked for by the analysis (``workers.deliver_notifications``, routed to the thread's queue); a run that finished
before a restart is analysed at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.models import Commit, Notification, NotificationStatus, Run, RunStatus, Target
from service.notifications.statuses import queue_status
from service.schema import upgrade_to_head
from service.settings import Settings
from tests.support.http_fakes import FakeServer, fake_server
from tests.support.workers import session_maker
from workers.celery_app import DELIVER_NOTIFICATIONS, RUN_SUITE, celery_config
from workers.embedded import EMBEDDED_BROKER_URL, embedded_config, resume_unanalysed_runs
from workers.embedded_outbox import OUTBOX_QUEUE, OutboxSender, outbox_config
from workers.notify import deliver_due
from workers.senders import Channels
from workers.settings import WorkerSettings

pytestmark = pytest.mark.integration

TOKEN = "ghp_outbox-thread-token"


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    url = f"sqlite:///{tmp_path / 'specwatch.db'}"
    upgrade_to_head(url)
    with session_maker(url) as made:
        yield made


@pytest.fixture
def github() -> Iterator[FakeServer]:
    with fake_server([(201, {})]) as server:
        yield server


@pytest.fixture
def celery() -> Iterator[Celery]:
    """A Celery app configured as ``serve`` configures the workers' (the production routes, the in-memory broker,
    the outbox route); no worker consumes from it."""
    app = Celery("outbox-test", set_as_current=False)
    production = celery_config(Settings(env="test"), WorkerSettings())
    app.conf.update(production)
    app.conf.update(embedded_config())
    app.conf.update(outbox_config(dict(production["task_routes"]), dict(production["beat_schedule"])))
    yield app
    app.close()


@pytest.fixture
def sender(factory: sessionmaker[Session], github: FakeServer) -> Iterator[OutboxSender]:
    channels = Channels(slack_webhook_url=None, github_token=TOKEN, github_api_url=github.url)
    outbox = OutboxSender(EMBEDDED_BROKER_URL, lambda: deliver_due(factory, channels, now=lambda: datetime.now(UTC), limit=5), batch=5)
    outbox.start()
    yield outbox
    outbox.stop()


def a_run_with_status(factory: sessionmaker[Session], sha: str, status: str, *, finished: bool = False) -> int:
    with session_scope(factory) as session:
        target = session.scalars(select(Target)).first() or Target(
            name="toy", repo_url="https://github.com/octo-org/toy", adapter="toy:f", branches=["main"]
        )
        commit = Commit(target=target, sha=sha, branch="main", branch_order=int(sha[0], 16))
        now = datetime.now(UTC)
        run = Run(
            commit=commit,
            profile="smoke",
            status=RunStatus.passed if finished else RunStatus.queued,
            finished_at=now - timedelta(seconds=1) if finished else None,
        )
        session.add(run)
        session.flush()
        queue_status(session, run, commit, status, "http://127.0.0.1:8000")
        return run.id


def sent(factory: sessionmaker[Session]) -> list[str]:
    with factory() as session:
        rows = session.scalars(select(Notification).where(Notification.status == NotificationStatus.sent).order_by(Notification.sent_at))
        return [row.event for row in rows]


def test_a_run_queued_gets_its_pending_status_out_without_a_worker(
    factory: sessionmaker[Session], sender: OutboxSender, celery: Celery, github: FakeServer
) -> None:
    """The webhook queues a run and publishes it: the thread wakes and sends its ``pending`` at once, while no
    worker could have (issue 26: it arrived after the run had passed)."""
    run_id = a_run_with_status(factory, "1" * 40, "pending")
    celery.send_task(RUN_SUITE, args=[run_id])
    wait_for(lambda: sent(factory) == ["pending"], "the pending status to be sent")
    assert [r.body["state"] for r in github.requests] == ["pending"]


def test_a_delivery_asked_by_the_analysis_goes_to_the_thread_not_the_worker(
    factory: sessionmaker[Session], sender: OutboxSender, celery: Celery, github: FakeServer
) -> None:
    """The analysis of a failing run writes "confirming" and asks for a delivery, then queues the confirmation run;
    the thread sends "confirming" though the (one-task) worker would be running the confirmation run."""
    a_run_with_status(factory, "2" * 40, "confirming")
    celery.send_task(DELIVER_NOTIFICATIONS)
    wait_for(lambda: sent(factory) == ["confirming"], "the confirming status to be sent")
    assert github.requests[0].body["description"].startswith("specwatch: smoke run failed; confirming")
    # Beat's periodic delivery goes to the thread's queue too, and every delivery message was taken by the thread.
    schedule = celery.conf.beat_schedule
    assert [e["options"]["queue"] for e in schedule.values() if e["task"] == DELIVER_NOTIFICATIONS] == [OUTBOX_QUEUE]
    with celery.connection_for_write() as connection:
        assert connection.default_channel.queue_declare(OUTBOX_QUEUE, passive=True).message_count == 0


def test_a_run_finished_before_a_restart_is_analysed_at_once(factory: sessionmaker[Session]) -> None:
    """A run that finished while ``serve`` was stopping was never analysed (its message died with the in-memory
    queue); the next start asks for its analysis at once, not after the sweeper's 10-minute grace."""
    finished_run = a_run_with_status(factory, "3" * 40, "success", finished=True)
    a_run_with_status(factory, "4" * 40, "pending")  # still queued: resume_queued_runs' business, not this one
    asked: list[int] = []
    assert resume_unanalysed_runs(factory, asked.append, now=datetime.now(UTC)) == [finished_run]
    assert asked == [finished_run]
