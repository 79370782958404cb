"""End-to-end fixtures: real Celery worker processes on real Redis and PostgreSQL, toy target repositories."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

# PostgreSQL scratch databases, shared with the integration tests.
from tests.integration.conftest import create_postgres_database, postgres_admin  # noqa: F401
from tests.support.toy_target import ToyRepo
from tests.support.workers import configured, flush_redis, migrate, session_maker, worker_environment

ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).parent / "celery")


@dataclass
class WorkerProcess:
    """``celery -A workers.celery_app worker`` in its own process group, its output in ``log``."""

    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and pool), as a machine loss would."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        """Cold shutdown (SIGQUIT): the tests are over, nothing is left to finish."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGQUIT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def database_url(create_postgres_database: Callable[[], str]) -> str:  # noqa: F811 -- the imported fixture
    url = create_postgres_database()
    migrate(url)
    return url


@pytest.fixture
def factory(database_url: str) -> Iterator[sessionmaker[Session]]:
    with session_maker(database_url) as made:
        yield made


@pytest.fixture
def worker_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, database_url: str) -> Iterator[dict[str, str]]:
    """The workers' SPECWATCH_* environment (short leases, a sweep every second); this process uses it too."""
    env = worker_environment(database_url, tmp_path, lease_s="3", heartbeat_s="1", sweep_interval_s="1")
    flush_redis()
    with configured(monkeypatch, env):
        yield env
    flush_redis()


@pytest.fixture
def start_worker(tmp_path: Path, worker_env: dict[str, str]) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real workers consuming ``gpu`` and ``default`` with one process; all are stopped at the end."""
    started: list[WorkerProcess] = []

    def start(name: str, *extra: str) -> WorkerProcess:
        log = tmp_path / f"{name}.log"
        command = [CELERY, "-A", "workers.celery_app", "worker", "-Q", "gpu,default", "-c", "1", "-n", f"{name}@%h"]
        command += ["--loglevel", "INFO", "--without-gossip", "--without-mingle", *extra]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command, cwd=ROOT, env={**os.environ, **worker_env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        worker = WorkerProcess(proc, log)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def toy_repo(tmp_path: Path) -> ToyRepo:
    return ToyRepo.create(tmp_path / "toy")


def wait_for(condition: Callable[[], bool], *, timeout: float, what: str, logs: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}\n--- worker output ---\n{logs()[-6000:]}")
        time.sleep(0.1)
