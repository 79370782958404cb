"""A real Celery worker consuming runs from real Redis: verdicts stored per commit, a killed worker's run redone once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.models import CaseResult, Run, RunStatus
from tests.e2e.conftest import WorkerProcess, wait_for
from tests.support.toy_target import ADAPTER, CORRECT, ToyRepo
from tests.support.workers import add_runs

# The module, not its app: see tests/integration/workers/test_tasks.py.
from workers import celery_app

# A worker start plus several suite runs: 10-20 s alone, over 30 s on a busy machine.
pytestmark = pytest.mark.slow

FINISHED = {RunStatus.passed, RunStatus.failed, RunStatus.error, RunStatus.cancelled}


def enqueue(run_id: int) -> None:
    """What the control plane does after commit: a message by task name, to the gpu queue."""
    celery_app.app.send_task("workers.run_suite", args=[run_id], queue="gpu")


def statuses(factory: sessionmaker[Session], run_ids: list[int]) -> list[RunStatus]:
    with factory() as session:
        found = {row.id: row.status for row in session.execute(select(Run.id, Run.status).where(Run.id.in_(run_ids)))}
    return [found[run_id] for run_id in run_ids]


def case_count(factory: sessionmaker[Session], run_id: int) -> int:
    with factory() as session:
        return session.scalar(select(func.count()).select_from(CaseResult).where(CaseResult.run_id == run_id)) or 0


def test_three_commits_pass_fail_pass(
    factory: sessionmaker[Session], toy_repo: ToyRepo, start_worker: Callable[..., WorkerProcess]
) -> None:
    run_ids = add_runs(factory, toy_repo.url, toy_repo.history(), adapter=ADAPTER)
    worker = start_worker("gpu-1")
    for run_id in run_ids:
        enqueue(run_id)

    wait_for(lambda: set(statuses(factory, run_ids)) <= FINISHED, timeout=180, what="three finished runs", logs=worker.output)

    assert statuses(factory, run_ids) == [RunStatus.passed, RunStatus.failed, RunStatus.passed]
    with factory() as session:
        assert session.scalars(select(Run.attempt).where(Run.id.in_(run_ids))).all() == [1, 1, 1]
    assert [case_count(factory, run_id) for run_id in run_ids] == [2, 2, 2]


def test_a_killed_worker_s_run_is_requeued_and_completed_exactly_once(
    factory: sessionmaker[Session], toy_repo: ToyRepo, start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    (run_id,) = add_runs(factory, toy_repo.url, [toy_repo.commit(CORRECT, "good")], adapter=ADAPTER)
    first = start_worker("gpu-1")
    enqueue(run_id)
    suite_started = tmp_path / "scratch" / f"run-{run_id}-attempt-1" / "suite.out"
    wait_for(suite_started.exists, timeout=120, what="the suite subprocess to start", logs=first.output)

    first.kill()  # mid-run: the suite needs seconds just to import torch

    assert statuses(factory, [run_id]) == [RunStatus.running]
    assert case_count(factory, run_id) == 0
    second = start_worker("gpu-2", "--beat", "--schedule", str(tmp_path / "beat-schedule"))
    wait_for(lambda: statuses(factory, [run_id])[0] in FINISHED, timeout=180, what="the run to be redone", logs=second.output)

    with factory() as session:
        run = session.get_one(Run, run_id)
    assert (run.status, run.attempt, run.error) == (RunStatus.passed, 2, None)
    assert run.worker_host is not None
    assert run.worker_host.split(":")[1] != str(first.proc.pid)
    assert case_count(factory, run_id) == 2
    assert "run_lease_expired" in second.output()
    assert not list((tmp_path / "scratch").iterdir())  # the dead attempt's scratch was cleaned up too
