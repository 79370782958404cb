"""Faults during a webhook burst, on private servers (the shared PostgreSQL and Redis are never touched).

The app is served as in production (``uvicorn --factory service.app:create_app``); a burst of signed pushes
comes from 8 client threads that retry as GitHub does (503 and connection errors are retried), while the test
restarts PostgreSQL or Redis under it.

- PostgreSQL stopped (as in a crash) and started again: requests meanwhile get 503 with ``Retry-After``,
  never 500; nothing is half-stored (a delivery without its commits and runs, or the reverse); once the
  database is back the retries succeed and every delivery, commit and run is stored exactly once.
- Redis killed (without persistence: its messages are lost) and started again: every request is still
  accepted, every run is persisted; the runs whose message was lost are enqueued by the sweeper
  (``workers.sweep_runs``), each exactly once, and nothing else is.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from service.db import make_engine, session_scope
from service.models import Commit, CommitPolicy, Delivery, DeliveryStatus, Run, RunStatus
from service.queue import RUN_SUITE_TASK, SUITE_QUEUE
from service.targets import add_target, make_spec
from tests.support.postgres import migrate
from tests.support.private_servers import ROOT, PrivatePostgres, private_postgres, private_redis, served_app, wait_for
from tests.support.pushes import REPO_URL, push_payload, sha, signed
from tests.support.workers import worker_environment
from workers.runs import claim_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECRET = "fault-test-webhook-secret"
DELIVERIES = 240
THREADS = 8
RETRY_FOR_S = 120.0


@dataclass
class Burst:
    """Signed pushes posted by ``THREADS`` clients that retry 503s and connection errors, as GitHub does."""

    base: str
    commits_per_push: int
    pushes: list[tuple[str, list[str]]] = field(default_factory=list)
    answers: Counter[int] = field(default_factory=Counter)
    connection_errors: int = 0
    retry_after: set[str | None] = field(default_factory=set)
    done: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The last ``held_back`` deliveries wait for ``released``: a fault is then sure to be followed by traffic.
    held_back: int = 0
    released: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.pushes = [(f"burst-{i}", [sha() for _ in range(self.commits_per_push)]) for i in range(DELIVERIES)]

    def run(self) -> None:
        limits = httpx.Limits(max_connections=THREADS, max_keepalive_connections=THREADS)
        with httpx.Client(base_url=self.base, limits=limits, timeout=30) as client, ThreadPoolExecutor(THREADS) as pool:
            first_held = len(self.pushes) - self.held_back
            futures = [
                pool.submit(self._deliver, client, delivery, shas, held=i >= first_held) for i, (delivery, shas) in enumerate(self.pushes)
            ]
            for future in futures:
                future.result()

    def _deliver(self, client: httpx.Client, delivery: str, shas: list[str], *, held: bool) -> None:
        if held and not self.released.wait(timeout=RETRY_FOR_S):
            raise AssertionError(f"delivery {delivery}: never released")
        body, headers = signed(SECRET, push_payload(shas), delivery=delivery)
        deadline = time.monotonic() + RETRY_FOR_S
        while True:
            try:
                answer = client.post("/webhooks/github", content=body, headers=headers)
            except httpx.TransportError:
                with self.lock:
                    self.connection_errors += 1
                status = None
            else:
                status = answer.status_code
                with self.lock:
                    self.answers[status] += 1
                    if status == 503:
                        self.retry_after.add(answer.headers.get("retry-after"))
            if status == 202:
                with self.lock:
                    self.done += 1
                return
            if status not in (None, 503) or time.monotonic() > deadline:
                raise AssertionError(f"delivery {delivery}: {status} {answer.text[:300] if status else ''}")
            time.sleep(0.2)  # GitHub waits longer; Retry-After is checked to be there

    error: BaseException | None = None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run_catching, daemon=True)
        thread.start()
        return thread

    def _run_catching(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # noqa: BLE001 -- reported by the test thread
            self.error = exc


def gpu_messages(url: str) -> list[int]:
    """The run id of every ``workers.run_suite`` message waiting in the ``gpu`` queue."""
    client = redis.Redis.from_url(url)
    try:
        raw = client.lrange(SUITE_QUEUE, 0, -1)
    finally:
        client.close()
    headers = [json.loads(item)["headers"] for item in raw]
    assert {h["task"] for h in headers} <= {RUN_SUITE_TASK}
    return [int(ast.literal_eval(h["argsrepr"])[0]) for h in headers]


def stored(factory: sessionmaker[Session]) -> tuple[list[Delivery], list[Commit], list[Run]]:
    with session_scope(factory) as session:
        return (
            list(session.scalars(select(Delivery))),
            list(session.scalars(select(Commit))),
            list(session.scalars(select(Run))),
        )


def register_target(factory: sessionmaker[Session], policy: CommitPolicy) -> None:
    with session_scope(factory) as session:
        add_target(session, make_spec(name="burst", repo_url=REPO_URL, branches=["main"], adapter="toy:f", commit_policy=policy))


def assert_stored_exactly_once(burst: Burst, factory: sessionmaker[Session]) -> list[Run]:
    deliveries, commits, runs = stored(factory)
    expected = dict(burst.pushes)
    assert sorted(d.github_delivery_id for d in deliveries) == sorted(expected)
    assert {d.status for d in deliveries} == {DeliveryStatus.accepted}
    # Nothing half-stored: each delivery came with all its commits, and no commit came without its delivery.
    assert sorted(c.sha for c in commits) == sorted(s for shas in expected.values() for s in shas)
    runs_per_commit = Counter(r.commit_id for r in runs)
    assert sorted(runs_per_commit) == sorted(c.id for c in commits)
    assert set(runs_per_commit.values()) == {1}
    return runs


def server_env(database_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    return {
        "SPECWATCH_ENV": "test",
        "SPECWATCH_DATABASE_URL": database_url,
        "SPECWATCH_REDIS_URL": redis_url,
        "SPECWATCH_WEBHOOK_SECRET": SECRET,
        **extra,
    }


@pytest.fixture
def own_postgres() -> Iterator[PrivatePostgres]:
    with private_postgres() as server:
        admin = create_engine(server.admin_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as connection:
                connection.execute(text('CREATE DATABASE "specwatch"'))
        finally:
            admin.dispose()
        migrate(server.url("specwatch"))
        yield server


def test_postgres_restarted_during_a_burst(own_postgres: PrivatePostgres, tmp_path: Path) -> None:
    database_url = own_postgres.url("specwatch")
    engine = make_engine(database_url)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    try:
        register_target(factory, CommitPolicy.every)
        with private_redis() as broker, served_app(server_env(database_url, broker.url()), tmp_path / "uvicorn.log") as base:
            burst = Burst(base, commits_per_push=2, held_back=DELIVERIES // 2)
            thread = burst.start()
            wait_for(lambda: burst.done >= DELIVERIES // 4 or not thread.is_alive(), timeout_s=120, what="the first quarter of the burst")
            own_postgres.stop("immediate")  # as in a crash: transactions in flight are cut
            burst.released.set()  # the second half is posted while the database is down
            time.sleep(2)
            down_answers = burst.answers[503]
            own_postgres.start()
            thread.join(timeout=RETRY_FOR_S + 60)
            assert not thread.is_alive()
            assert burst.error is None, burst.error

            assert burst.answers[500] == 0
            assert set(burst.answers) <= {202, 503}
            assert down_answers > 0, "no request met the database down"
            assert burst.retry_after == {"5"}
            engine.dispose()  # its pooled connections died with the server
            runs = assert_stored_exactly_once(burst, factory)
            assert {r.status for r in runs} == {RunStatus.queued}
            messages = gpu_messages(broker.url())
            # Every committed run is enqueued once; none twice. (A commit whose acknowledgement the crash cut
            # would be retried as a duplicate delivery and its runs left to the sweeper: allowed, but counted.)
            assert len(messages) == len(set(messages))
            assert set(messages) <= {r.id for r in runs}
            left_to_sweeper = {r.id for r in runs} - set(messages)
            assert all(r.lease_expires_at is not None for r in runs if r.id in left_to_sweeper)
            assert len(left_to_sweeper) <= 2 * THREADS * burst.commits_per_push
    finally:
        engine.dispose()


def test_redis_restarted_during_a_burst(create_migrated_postgres_database: Callable[[], str], tmp_path: Path) -> None:
    database_url = create_migrated_postgres_database()
    engine = make_engine(database_url)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    try:
        register_target(factory, CommitPolicy.head)
        with private_redis() as broker:
            env = server_env(database_url, broker.url(), SPECWATCH_QUEUED_LEASE_S="2")
            with served_app(env, tmp_path / "uvicorn.log") as base:
                burst = Burst(base, commits_per_push=1, held_back=DELIVERIES // 4)
                thread = burst.start()
                wait_for(
                    lambda: burst.done >= DELIVERIES // 4 or not thread.is_alive(), timeout_s=120, what="the first quarter of the burst"
                )
                broker.stop()  # its messages are lost with it
                time.sleep(2)
                broker.start()
                burst.released.set()  # the last quarter is posted once Redis is back: their messages survive
                thread.join(timeout=RETRY_FOR_S + 60)
                assert not thread.is_alive()
                assert burst.error is None, burst.error
            started = datetime.now(UTC)

            # Redis down never fails a request: the runs are in the database.
            assert set(burst.answers) == {202}
            runs = assert_stored_exactly_once(burst, factory)
            messages = gpu_messages(broker.url())
            assert len(messages) == len(set(messages))
            lost = {r.id for r in runs} - set(messages)
            assert lost, "no message was lost: the restart did not hit the burst"
            assert len(messages) >= DELIVERIES // 4, "the deliveries posted after the restart were not enqueued"

            # A worker consumes the messages that survived (claims their runs) ...
            client = redis.Redis.from_url(broker.url())
            try:
                client.delete(SUITE_QUEUE)
            finally:
                client.close()
            with session_scope(factory) as session:
                for run_id in messages:
                    claim_run(session, run_id, worker="worker:1", now=started, lease_s=600)
            # ... and once the queued runs' lease (2 s) expired, the sweeper enqueues exactly the lost ones.
            time.sleep(max(0.0, 2.5 - (datetime.now(UTC) - started).total_seconds()))
            report = sweep(database_url, broker.url(), tmp_path)
            assert sorted(report["requeued"]) == sorted(lost)
            assert sorted(gpu_messages(broker.url())) == sorted(lost)
            assert sweep(database_url, broker.url(), tmp_path) == {"requeued": [], "gave_up": []}
            with session_scope(factory) as session:
                statuses = Counter(session.scalars(select(Run.status)))
                assert statuses == Counter({RunStatus.queued: len(lost), RunStatus.running: len(messages)})
                assert session.scalar(select(func.count()).select_from(Run)) == DELIVERIES
    finally:
        engine.dispose()


def sweep(database_url: str, redis_url: str, tmp_path: Path) -> dict[str, Any]:
    """``workers.sweep_runs`` called in a process of its own configured for these servers (this process's
    Celery app may already be configured for the shared Redis by other tests)."""
    env = worker_environment(database_url, tmp_path)
    env.update(SPECWATCH_REDIS_URL=redis_url, SPECWATCH_QUEUED_LEASE_S="900")
    script = "import json; from workers import tasks; print(json.dumps(tasks.sweep_runs()))"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env={**_clean_environ(), **env}, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _clean_environ() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith("SPECWATCH_")}
