"""The dashboard in a real browser: headless Chromium (Debian's ``chromium`` package) against uvicorn serving a
seeded PostgreSQL database. The timeline marks the failing commit and the case page's charts have points.

CI installs ``chromium`` (and ``chromium-driver``); a missing browser fails the test, never skips it.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvicorn
from pydantic import SecretStr
from sqlalchemy.orm import sessionmaker

from service.app import create_app
from service.db import make_engine, session_scope
from service.settings import Settings
from tests.e2e.conftest import wait_for
from tests.support.history import FAILING_CASE, TARGET, Seeded, seed_history

POINT = re.compile(r"-?\d+(?:\.\d+)?,-?\d+(?:\.\d+)?")


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("headless Chromium is not installed: apt-get install -y chromium chromium-driver", pytrace=False)
    return found


@pytest.fixture
def seeded_url(create_migrated_postgres_database: Callable[[], str]) -> tuple[str, Seeded]:
    url = create_migrated_postgres_database()
    engine = make_engine(url)
    try:
        with session_scope(sessionmaker(bind=engine, expire_on_commit=False)) as session:
            seeded = seed_history(session)
    finally:
        engine.dispose()
    return url, seeded


@pytest.fixture
def served(seeded_url: tuple[str, Seeded]) -> Iterator[str]:
    database_url, _ = seeded_url
    settings = Settings(env="test", database_url=database_url, redis_url="redis://127.0.0.1:1/0", webhook_secret=SecretStr("x"))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), timeout=30, what="uvicorn to start")
        assert server.started
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def dump_dom(url: str, tmp_path: Path) -> str:
    """The DOM Chromium built for ``url`` (after parsing and layout), as HTML."""
    command = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--dump-dom",
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_timeline_marks_the_failing_commit_in_a_browser(served: str, seeded_url: tuple[str, Seeded], tmp_path: Path) -> None:
    _, seeded = seeded_url
    dom = dump_dom(f"{served}/ui/targets/{TARGET}", tmp_path)
    rows = re.findall(r"<tr[^>]*data-sha=\"([0-9a-f]+)\"[^>]*>", dom)
    assert len(rows) == 8
    marked = re.findall(r'<tr[^>]*data-sha="([0-9a-f]+)"[^>]*data-first-failing="true"', dom)
    assert marked == [seeded.shas[4]]
    assert "first failing" in dom


def test_case_charts_render_non_empty_in_a_browser(served: str, tmp_path: Path) -> None:
    dom = dump_dom(f"{served}/ui/targets/{TARGET}/cases/{FAILING_CASE}", tmp_path)
    assert dom.count("<svg") == 3
    paths = re.findall(r'<path class="series" d="([^"]*)"', dom)
    assert [len(POINT.findall(d)) for d in paths] == [6] * 5
    assert dom.count('class="fail-mark"') == 6
