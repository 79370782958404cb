"""The monitoring loop end to end, all real: GitHub push webhooks → the app served by uvicorn → PostgreSQL →
Redis → a worker started with ``specwatch worker`` → a mirror clone of a git repository → the suite → PostgreSQL.

The toy library's sampler is correct, then buggy (swapped residual), then fixed: three pushes, three runs,
pass / fail / pass. And with Redis unreachable when the webhooks arrive: the deliveries and runs are stored,
GitHub gets its 202, and the sweeper enqueues the runs once a worker on a working Redis runs it.

Redis: the worker tests' database of this test process (``tests.support.workers.REDIS_URL``), flushed by
``worker_env``; each xdist process has its own, so parallel tests never consume each other's messages.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.models import CaseResult, Commit, Delivery, DeliveryStatus, Run, RunPurpose, RunStatus, Verdict
from tests.e2e.conftest import SPECWATCH, WRITE, WorkerProcess, app_settings, served, spawn, wait_for
from tests.support.github import REPO_URL, push_history
from tests.support.toy_target import ADAPTER, ToyRepo
from tests.support.workers import REDIS_URL, WEBHOOK_SECRET

# A worker start and three suite runs: 20-40 s each test.
pytestmark = pytest.mark.slow

UNREACHABLE_REDIS_URL = "redis://127.0.0.1:1/0"
FINISHED = {RunStatus.passed, RunStatus.failed, RunStatus.error, RunStatus.cancelled}
TARGET = {"name": "toy-sampler", "repo_url": REPO_URL, "branches": ["main"], "adapter": ADAPTER, "commit_policy": "head"}


def statuses_by_commit(factory: sessionmaker[Session], shas: list[str]) -> list[list[RunStatus]]:
    """The statuses of every primary run of each commit (not confirmations or bisection), in the order of ``shas``."""
    with factory() as session:
        query = select(Commit.sha, Run.status).join(Run.commit).where(Commit.sha.in_(shas), Run.purpose == RunPurpose.primary)
        rows = session.execute(query.order_by(Run.id)).all()
    found: dict[str, list[RunStatus]] = {sha: [] for sha in shas}
    for sha, status in rows:
        found[sha].append(status)
    return [found[sha] for sha in shas]


def all_finished(factory: sessionmaker[Session], shas: list[str]) -> bool:
    return all(runs and set(runs) <= FINISHED for runs in statuses_by_commit(factory, shas))


def verdicts(factory: sessionmaker[Session], sha: str) -> list[Verdict]:
    with factory() as session:
        return list(
            session.scalars(
                select(CaseResult.verdict)
                .join(Run, CaseResult.run_id == Run.id)
                .join(Run.commit)
                .where(Commit.sha == sha, Run.purpose == RunPurpose.primary)
                .order_by(CaseResult.case_id)
            )
        )


def queued_tasks(queue: str = "gpu") -> list[str]:
    """The task names of the messages waiting in ``queue`` on this test's Redis."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return [json.loads(message)["headers"]["task"] for message in client.lrange(queue, 0, -1)]
    finally:
        client.close()


def test_three_signed_pushes_give_pass_fail_pass(
    database_url: str, factory: sessionmaker[Session], toy_repo: ToyRepo, start_service_worker: Callable[..., WorkerProcess]
) -> None:
    good, bad, fixed = shas = list(toy_repo.history())
    worker = start_service_worker("gpu-1")

    with served(create_app(app_settings(database_url, REDIS_URL))) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/targets", json=TARGET, headers=WRITE).status_code == 201
        answers = push_history(client, WEBHOOK_SECRET, toy_repo.path, shas)
        wait_for(
            lambda: all_finished(factory, shas) or worker.proc.poll() is not None,
            timeout=240,
            what="three finished runs",
            logs=worker.output,
        )

    assert worker.proc.poll() is None, worker.output()
    assert [answer.status_code for answer in answers] == [202, 202, 202]
    assert [(answer.json()["outcome"], answer.json()["commits"], len(answer.json()["runs"])) for answer in answers] == [
        ("accepted", 1, 1)
    ] * 3
    assert statuses_by_commit(factory, shas) == [[RunStatus.passed], [RunStatus.failed], [RunStatus.passed]]
    assert set(verdicts(factory, good)) == set(verdicts(factory, fixed)) == {Verdict.PASS}
    assert Verdict.FAIL in verdicts(factory, bad)
    assert len(verdicts(factory, bad)) == 2  # the smoke profile's two cases, stored once
    with factory() as session:
        assert session.scalars(select(Run.attempt).where(Run.purpose == RunPurpose.primary).order_by(Run.id)).all() == [1, 1, 1]
        assert session.scalars(select(Delivery.status)).all() == [DeliveryStatus.accepted] * 3
        assert session.execute(select(Commit.sha, Commit.branch_order).order_by(Commit.branch_order)).all() == [
            (good, 1),
            (bad, 2),
            (fixed, 3),
        ]


def test_runs_queued_while_redis_is_down_are_swept_and_completed(
    database_url: str, factory: sessionmaker[Session], toy_repo: ToyRepo, start_service_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    shas = list(toy_repo.history())
    # The producer's broker is a closed port; queued runs' lease is one second, so the sweeper takes them at once.
    settings = app_settings(database_url, UNREACHABLE_REDIS_URL, queued_lease_s=1)

    with served(create_app(settings)) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/targets", json=TARGET, headers=WRITE).status_code == 201
        answers = push_history(client, WEBHOOK_SECRET, toy_repo.path, shas)

    assert [answer.status_code for answer in answers] == [202, 202, 202]
    assert [answer.json()["outcome"] for answer in answers] == ["accepted"] * 3
    assert statuses_by_commit(factory, shas) == [[RunStatus.queued]] * 3
    assert queued_tasks() == []  # nothing reached the broker
    with factory() as session:
        assert session.scalar(select(func.count()).select_from(Delivery)) == 3

    # Redis is back: a worker with beat (sweeping every second, see worker_env) finds the stored runs.
    worker = start_service_worker("gpu-1", "--beat", "--schedule", str(tmp_path / "beat-schedule"))
    wait_for(
        lambda: all_finished(factory, shas) or worker.proc.poll() is not None,
        timeout=240,
        what="the swept runs to finish",
        logs=worker.output,
    )

    assert worker.proc.poll() is None, worker.output()
    assert statuses_by_commit(factory, shas) == [[RunStatus.passed], [RunStatus.failed], [RunStatus.passed]]
    assert "sweep requeued=" in worker.output()
    with factory() as session:
        assert session.scalars(select(Run.attempt).where(Run.purpose == RunPurpose.primary).order_by(Run.id)).all() == [1, 1, 1]
        assert session.scalar(select(func.count()).select_from(CaseResult)) == 6


def test_specwatch_beat_sends_the_sweeper_to_the_default_queue(worker_env: dict[str, str], tmp_path: Path) -> None:
    command = [SPECWATCH, "beat", "--schedule", str(tmp_path / "beat-schedule")]
    beat = spawn(command, {**os.environ, **worker_env}, tmp_path / "beat.log")
    try:
        wait_for(lambda: "workers.sweep_runs" in queued_tasks("default"), timeout=60, what="a sweep message", logs=beat.output)
    finally:
        beat.stop()
