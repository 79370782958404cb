"""The code under test cannot reach the worker (issue 14, "The code under test can read the service's secrets").

A real worker process (started with the webhook secret in its environment, on a SQLite database, as ``specwatch
serve`` runs) tests a commit whose sampler first tries three things: find the secret in any process's
``/proc/<pid>/environ`` (the worker's among them), write the service's database, open a TCP connection to a
server of this test. Under bubblewrap all three fail and the suite still runs and passes; with the sandbox off
(the documented fallback, loudly logged) the same commit succeeds at all three, which is what the probe saw.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from service.models import Run
from tests.support.postgres import migrate
from tests.support.toy_target import ADAPTER, CORRECT, ToyRepo
from tests.support.workers import WEBHOOK_SECRET, add_runs, flush_redis, session_maker, worker_environment

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MARK = "HOSTILE-PROBE "


def hostile(database: Path, port: int) -> str:
    """The correct sampler, preceded by the three attempts; what happened is printed on stderr as one JSON line."""
    probe = f"""
import json as _json
import os as _os
import socket as _socket
import sqlite3 as _sqlite3
import sys as _sys


def _probe():
    seen = {{}}
    leaked = []
    for pid in [p for p in _os.listdir("/proc") if p.isdigit()]:
        try:
            with open(f"/proc/{{pid}}/environ", "rb") as f:
                if {WEBHOOK_SECRET.encode()!r} in f.read():
                    leaked.append(pid)
        except OSError:
            pass
    seen["environ"] = "leaked" if leaked else "refused"
    try:
        with open("/proc/{{}}/environ".format(_os.getppid()), "rb") as f:
            f.read()
        seen["parent_environ"] = "read"
    except OSError as exc:
        seen["parent_environ"] = type(exc).__name__
    try:
        db = _sqlite3.connect("file:" + {str(database)!r} + "?mode=rw", uri=True)  # the service's file, never a new one
        db.execute("CREATE TABLE pwned (x)")
        db.commit()
        db.close()
        seen["database"] = "written"
    except Exception as exc:
        seen["database"] = type(exc).__name__
    try:
        _socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
        seen["network"] = "connected"
    except OSError as exc:
        seen["network"] = type(exc).__name__
    seen["uid"] = _os.getuid()
    print({MARK!r} + _json.dumps(seen), file=_sys.stderr, flush=True)


_probe()
"""
    return CORRECT.replace("import torch\n", "import torch\n" + probe, 1)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    try:
        yield server
    finally:
        server.close()


def run_worker(tmp_path: Path, sandbox: str, listener: socket.socket) -> tuple[dict[str, Any], Run, str]:
    """One run of the hostile commit by a worker subprocess; (what the sampler saw, the run, the worker's log)."""
    database = tmp_path / "specwatch.db"
    url = f"sqlite:///{database}"
    migrate(url)
    repo = ToyRepo.create(tmp_path / "toy")
    sha = repo.commit(hostile(database, listener.getsockname()[1]), "a sampler that probes its sandbox")
    with session_maker(url) as factory:
        (run_id,) = add_runs(factory, repo.url, [sha], adapter=ADAPTER)
    env = {name: value for name, value in os.environ.items() if not name.startswith("SPECWATCH_")}
    env |= worker_environment(url, tmp_path, sandbox=sandbox, lease_s="60", heartbeat_s="5")
    script = (
        "import logging, sys; logging.basicConfig(level=logging.INFO); from workers import tasks; print(tasks.run_suite(int(sys.argv[1])))"
    )
    flush_redis()
    try:
        worker = subprocess.run(
            [sys.executable, "-c", script, str(run_id)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
        )
    finally:
        flush_redis()
    assert worker.returncode == 0, worker.stderr[-3000:]
    with session_maker(url) as factory, factory() as session:
        run = session.scalars(select(Run).where(Run.id == run_id)).one()
    lines = [line for line in (run.log_tail or "").splitlines() if line.startswith(MARK)]
    assert lines, f"the sampler's probe did not report (run {run.status}: {run.error}; log tail {run.log_tail!r})"
    return json.loads(lines[-1].removeprefix(MARK)), run, worker.stderr


def _connections(listener: socket.socket) -> int:
    count = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def _tables(database: Path) -> set[str]:
    with sqlite3.connect(database) as db:
        return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


@pytest.mark.slow
def test_the_code_under_test_reaches_neither_secrets_nor_database_nor_network(tmp_path: Path, listener: socket.socket) -> None:
    seen, run, log = run_worker(tmp_path, "bwrap", listener)

    assert seen["environ"] == "refused"  # no process shows the secret: the worker is not visible at all
    # (Its parent is bubblewrap's init in the new pid namespace, whose environment is the suite's clean one.)
    assert seen["database"] == "OperationalError"  # the database file is not there to open
    assert seen["network"] == "ConnectionRefusedError"  # its own loopback, where nothing listens
    assert seen["uid"] == 65534
    assert "pwned" not in _tables(tmp_path / "specwatch.db")
    assert _connections(listener) == 0
    # ... while the suite ran and passed on the sampler (the probe does not change its law).
    assert run.status.value == "passed", run.error
    assert "SUITE NOT ISOLATED" not in log


@pytest.mark.slow
def test_without_the_sandbox_the_probe_succeeds_and_a_warning_says_so(tmp_path: Path, listener: socket.socket) -> None:
    """The documented fallback (SPECWATCH_WORKER_SANDBOX=off): what issue 14's probe saw, now loudly logged."""
    seen, run, log = run_worker(tmp_path, "off", listener)

    assert "SUITE NOT ISOLATED" in log
    assert seen["environ"] == "leaked"
    assert seen["database"] == "written"
    assert seen["network"] == "connected"
    assert "pwned" in _tables(tmp_path / "specwatch.db")
    assert _connections(listener) == 1
    assert run.status.value == "passed", run.error
