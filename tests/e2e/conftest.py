"""End-to-end fixtures: real Celery worker processes on real Redis and PostgreSQL (the environment, the
database and the toy target repository are tests/support/workers.py's, with short leases here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).parent / "celery")


@dataclass
class WorkerProcess:
    """A worker (``celery -A workers.celery_app worker``, ``specwatch worker``) in its own process group, its
    output in ``log``."""

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
def worker_timing() -> dict[str, str]:
    """Real worker processes hold a run for 3 s, beat every second and sweep every second."""
    return {"lease_s": "3", "heartbeat_s": "1", "sweep_interval_s": "1"}


def spawn(command: list[str], env: Mapping[str, str], log: Path) -> WorkerProcess:
    """Start ``command`` in the repository, in its own process group, its output in ``log``."""
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return WorkerProcess(proc, log)


@pytest.fixture
def started_workers() -> Iterator[list[WorkerProcess]]:
    """The workers a test started; all are stopped at the end."""
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop()


@pytest.fixture
def start_worker(tmp_path: Path, worker_env: dict[str, str], started_workers: list[WorkerProcess]) -> Callable[..., WorkerProcess]:
    """Start real workers consuming ``gpu`` and ``default`` with one process; all are stopped at the end."""

    def start(name: str, *extra: str) -> WorkerProcess:
        command = [CELERY, "-A", "workers.celery_app", "worker", "-Q", "gpu,default", "-c", "1", "-n", f"{name}@%h"]
        command += ["--loglevel", "INFO", "--without-gossip", "--without-mingle", *extra]
        worker = spawn(command, {**os.environ, **worker_env}, tmp_path / f"{name}.log")
        started_workers.append(worker)
        return worker

    return start


def wait_for(condition: Callable[[], bool], *, timeout: float, what: str, logs: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}\n--- worker output ---\n{logs()[-6000:]}")
        time.sleep(0.1)
