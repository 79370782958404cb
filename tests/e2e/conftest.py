"""End-to-end fixtures: real Celery worker processes on real Redis and PostgreSQL (the environment, the
database and the toy target repository are tests/support/workers.py's, with short leases here), and the
control plane served by uvicorn with a ``specwatch worker`` beside it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from service.auth import hash_token
from service.settings import Settings
from tests.support.github import git_redirect
from tests.support.toy_target import ToyRepo
from tests.support.workers import WEBHOOK_SECRET

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


SPECWATCH = str(Path(sys.executable).parent / "specwatch")
API_TOKEN = "e2e-test-api-token"
WRITE = {"Authorization": f"Bearer {API_TOKEN}"}


def app_settings(database_url: str, redis_url: str, **values: Any) -> Settings:
    """The control plane's settings: runs of the ``smoke`` profile, a known webhook secret."""
    return Settings(
        env="test",
        database_url=database_url,
        redis_url=redis_url,
        webhook_secret=WEBHOOK_SECRET,
        run_profile="smoke",
        api_token_hashes=[hash_token(API_TOKEN)],
        **values,
    )


@contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """``app`` served by uvicorn in a thread, on a port of 127.0.0.1 bound here (no race for a free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), timeout=30, what="uvicorn to start")
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture
def start_service_worker(
    tmp_path: Path, worker_env: dict[str, str], toy_repo: ToyRepo, started_workers: list[WorkerProcess]
) -> Callable[..., WorkerProcess]:
    """Start ``specwatch worker`` (the production command) on this test's Redis and PostgreSQL; its git
    fetches the toy repository under its GitHub URL. Every worker is stopped at the end."""

    def start(name: str, *extra: str) -> WorkerProcess:
        env = {**os.environ, **worker_env, **git_redirect(toy_repo.path)}  # as the test set it up to now
        command = [SPECWATCH, "worker", "--queues", "gpu,default", "--concurrency", "1", "--hostname", f"{name}@%h"]
        command += ["--without-gossip", "--without-mingle", *extra]
        worker = spawn(command, env, tmp_path / f"{name}.log")
        started_workers.append(worker)
        return worker

    return start
