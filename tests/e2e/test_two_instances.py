"""Two instances on one machine, each with a fresh database and a real worker process, run their run 1 at once:
both pass on their first attempt (issue 42, item 1). Before, both used ``$TMPDIR/specwatch-runs/run-1-attempt-1``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.models import Run, RunStatus
from service.queue import CeleryProducer
from tests.e2e.conftest import CELERY, WorkerProcess, spawn, wait_for
from tests.support.redis_databases import redis_url
from tests.support.toy_target import ADAPTER, CORRECT, ToyRepo
from tests.support.workers import add_runs, session_maker

# Two worker starts and two suite runs at once: over 10 s.
pytestmark = pytest.mark.slow

FINISHED = {RunStatus.passed, RunStatus.failed, RunStatus.error, RunStatus.uninstallable}


def run_one(factory: sessionmaker[Session]) -> tuple[RunStatus, int, str | None]:
    with factory() as session:
        run = session.scalars(select(Run).where(Run.id == 1)).one()
        return run.status, run.attempt, run.error


def test_two_instances_with_real_workers_both_pass_their_run_1_on_the_first_attempt(
    tmp_path: Path,
    worker_env: dict[str, str],
    factory: sessionmaker[Session],
    create_migrated_postgres_database: Callable[[], str],
    toy_repo: ToyRepo,
    started_workers: list[WorkerProcess],
) -> None:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    # One machine: the same HOME and TMPDIR, each instance's folders left to their defaults.
    machine = {"HOME": str(home), "TMPDIR": str(tmp)}
    folders = ("SPECWATCH_WORKER_MIRROR_DIR", "SPECWATCH_WORKER_SCRATCH_DIR")  # this process has them (worker_env)
    inherited = {k: v for k, v in os.environ.items() if k not in folders}
    base = {k: v for k, v in worker_env.items() if k not in folders}
    sha = toy_repo.commit(CORRECT, "good")
    with session_maker(create_migrated_postgres_database()) as other:
        second = {**base, "SPECWATCH_DATABASE_URL": str(other.kw["bind"].url.render_as_string(hide_password=False))}
        second["SPECWATCH_REDIS_URL"] = redis_url("second-instance")
        instances = [(factory, base), (other, second)]
        for name, (made, env) in zip(("first", "second"), instances, strict=True):
            assert add_runs(made, toy_repo.url, [sha], adapter=ADAPTER) == [1]
            command = [CELERY, "-A", "workers.celery_app", "worker", "-Q", "gpu,default", "-c", "1", "-n", f"{name}@%h"]
            command += ["--loglevel", "INFO", "--without-gossip", "--without-mingle"]
            started_workers.append(spawn(command, {**inherited, **env, **machine}, tmp_path / f"{name}.log"))
        for _, env in instances:
            producer = CeleryProducer(env["SPECWATCH_REDIS_URL"])
            try:
                producer.send_run(1)
            finally:
                producer.close()

        def logs() -> str:
            return "\n".join(worker.output() for worker in started_workers)

        wait_for(lambda: all(run_one(made)[0] in FINISHED for made, _ in instances), timeout=240, what="both runs 1", logs=logs)
        finished = [run_one(made) for made, _ in instances]

    assert finished == [(RunStatus.passed, 1, None), (RunStatus.passed, 1, None)], logs()[-4000:]
    scratch = sorted((tmp / "specwatch-runs").iterdir())
    mirrors = sorted((home / ".cache" / "specwatch" / "instances").iterdir())
    assert len(scratch) == 2  # a folder per instance, each emptied after its run
    assert all(not list(folder.iterdir()) for folder in scratch)
    assert len(mirrors) == 2
    assert [folder.name for folder in scratch] == [folder.name for folder in mirrors]
