"""The dashboard in a real browser: headless Chromium (Debian's ``chromium`` package) against uvicorn serving a
seeded PostgreSQL database. The timeline marks the failing commit and the case page's charts have points;
through Selenium and ``chromedriver``, a person signs in with a write token, acknowledges the open alert from
the alerts page and signs out.

CI installs ``chromium`` and ``chromium-driver``; a missing browser or driver fails the test, never skips it.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from pydantic import SecretStr
from sqlalchemy.orm import sessionmaker

from service.app import create_app
from service.auth import hash_token
from service.db import make_engine, session_scope
from service.models import Alert, AlertState
from service.settings import Settings
from tests.e2e.conftest import wait_for
from tests.support.history import FAILING_CASE, TARGET, Seeded, seed_history

POINT = re.compile(r"-?\d+(?:\.\d+)?,-?\d+(?:\.\d+)?")
WRITE_TOKEN = "browser-write-token"


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
    settings = Settings(
        env="test",
        database_url=database_url,
        redis_url="redis://127.0.0.1:1/0",
        webhook_secret=SecretStr("x"),
        api_token_hashes=[hash_token(WRITE_TOKEN)],
        session_secret=SecretStr("browser-test-session-secret"),
    )
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
    assert [len(POINT.findall(d)) for d in paths] == [6] * 4
    assert dom.count('class="fail-mark"') == 6


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Headless Chromium driven by Debian's chromedriver (never one downloaded by Selenium Manager)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    driver_path = shutil.which("chromedriver")
    if driver_path is None:
        pytest.fail("chromedriver is not installed: apt-get install -y chromium-driver", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium()
    for argument in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def alert_state(database_url: str, alert_id: int) -> AlertState:
    engine = make_engine(database_url)
    try:
        with session_scope(sessionmaker(bind=engine)) as session:
            alert = session.get(Alert, alert_id)
            assert alert is not None
            return alert.state
    finally:
        engine.dispose()


def _click_and_wait(browser: Any, element: Any) -> None:
    """Click a form's button and wait until its page is replaced (a click does not wait for the navigation).

    While the old page is being torn down, Chromium may answer a poll with "Node with given id does not belong to
    the document" (a plain WebDriverException, not a stale-element one): that poll is retried, and the next one
    sees the element stale. A page that is never replaced still times out."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    element.click()
    WebDriverWait(browser, 30, ignored_exceptions=(WebDriverException,)).until(expected_conditions.staleness_of(element))


def test_sign_in_and_acknowledge_an_alert_in_a_browser(served: str, seeded_url: tuple[str, Seeded], browser: Any) -> None:
    from selenium.webdriver.common.by import By

    database_url, seeded = seeded_url
    browser.get(f"{served}/ui/alerts")
    assert not browser.find_elements(By.CSS_SELECTOR, "button.acknowledge")
    browser.find_element(By.ID, "sign-in").click()
    browser.find_element(By.ID, "token").send_keys(WRITE_TOKEN)
    _click_and_wait(browser, browser.find_element(By.ID, "submit"))
    # Back on the alerts page, signed in: the session cookie is HttpOnly (no script can read it).
    assert browser.current_url == f"{served}/ui/alerts"
    cookie = browser.get_cookie("specwatch_session")
    assert cookie is not None
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, "Strict", "/ui")
    assert "specwatch_session" not in browser.execute_script("return document.cookie")
    row = browser.find_element(By.ID, f"alert-{seeded.open_alert}")
    _click_and_wait(browser, row.find_element(By.CSS_SELECTOR, "button.acknowledge"))
    row = browser.find_element(By.ID, f"alert-{seeded.open_alert}")
    assert row.find_element(By.CSS_SELECTOR, "td.state").text == "acknowledged"
    assert alert_state(database_url, seeded.open_alert) is AlertState.acknowledged
    _click_and_wait(browser, browser.find_element(By.ID, "sign-out"))
    assert browser.get_cookie("specwatch_session") is None
    browser.get(f"{served}/ui/alerts")
    assert browser.find_elements(By.ID, "sign-in")
    assert not browser.find_elements(By.CSS_SELECTOR, "button.resolve")
