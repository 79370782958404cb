"""Private PostgreSQL and Redis servers that a test may stop and restart, and the app served by uvicorn.

Fault tests never touch the shared servers (PostgreSQL on 5432, Redis on 6379: other tests run against them
concurrently). They start their own: PostgreSQL from ``initdb``/``pg_ctl`` in a temporary directory on a free
port (as the ``postgres`` user when running as root, which initdb refuses), Redis as a ``redis-server``
subprocess without persistence. Stopping Redis loses its messages, as a restart of a Redis without
persistence does.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(ready: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout_s} s")
        time.sleep(0.05)


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster of our own (trust authentication, user ``postgres``, no fsync) on ``port``."""

    bindir: Path
    datadir: Path
    port: int

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _as_postgres(self, *argv: str) -> None:
        command = list(argv)
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.datadir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._as_postgres(
            str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-o", options, "-w", "-l", str(self.datadir / "log"), "start"
        )

    def stop(self, mode: str = "immediate") -> None:
        """``immediate``: the server dies as in a crash (open transactions are lost, clients see errors)."""
        self._as_postgres(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop")


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    bindir = _postgres_bin()
    if bindir is None:
        pytest.fail("PostgreSQL server binaries (/usr/lib/postgresql/*/bin) are needed for the fault tests", pytrace=False)
    base = Path(tempfile.mkdtemp(prefix="specwatch-pg-"))
    datadir = base / "data"
    try:
        datadir.mkdir()
        if os.geteuid() == 0:
            shutil.chown(base, "postgres")
            shutil.chown(datadir, "postgres")
        server = PrivatePostgres(bindir, datadir, free_port())
        server._as_postgres(str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")
        server.start()
        try:
            yield server
        finally:
            with suppress(subprocess.CalledProcessError):
                server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class PrivateRedis:
    """A ``redis-server`` of our own on ``port``, without persistence."""

    port: int
    process: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                shutil.which("redis-server") or "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: _port_open(self.port), timeout_s=10, what="redis-server")

    def stop(self) -> None:
        """Kill it (SIGKILL): its messages are gone, its clients' connections broken."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is needed for the fault tests", pytrace=False)
    server = PrivateRedis(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def served_uvicorn(env: Mapping[str, str], log_path: Path, *, log_level: str = "warning") -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``uvicorn --factory service.app:create_app`` on a free loopback port, configured by ``env``; its base URL
    and process (``log_level="info"`` keeps the access log)."""
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "--factory", "service.app:create_app", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--log-level", log_level]
    clean = {name: value for name, value in os.environ.items() if not name.startswith("SPECWATCH_")}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env={**clean, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: _healthy(base) or proc.poll() is not None, timeout_s=60, what="uvicorn")
            if proc.poll() is not None:
                raise RuntimeError(f"uvicorn exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
            yield base, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def served_app(env: Mapping[str, str], log_path: Path) -> Iterator[str]:
    """:func:`served_uvicorn` with its access log off; its base URL."""
    with served_uvicorn(env, log_path) as (base, _proc):
        yield base


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code in (200, 503)
    except httpx.HTTPError:
        return False
