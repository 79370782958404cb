"""Slow clients against the compose stack's reverse proxy (issue 42, item 7): nginx with the shipped
configuration (compose/nginx/specwatch.conf, run by tests/support/reverse_proxy.py) in front of the app.

The hostile scenario: 16 connections declare a body under a well-formed but false signature, send part of it,
then drip a byte a second. The app is given a small body budget that these clients fill when they reach it
directly (the control: signed pushes get 503). Through the proxy, which buffers each body before the app sees
it, the same clients hold nothing of the app (its budget stays at 0 bytes) and every signed push is accepted.
The proxy's own limits are those of the app: a stalled body ends at its read timeout (408), a body over the
app's size limit is refused (413) and one at the limit gets through.
"""

from __future__ import annotations

import re
import select
import socket
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from service.settings import Settings
from tests.security.conftest import SECRET
from tests.security.test_slow_body_probes import Served, served_webhooks
from tests.support.private_servers import wait_for
from tests.support.pushes import push_payload, signed
from tests.support.reverse_proxy import SHIPPED, nginx_in_front

pytestmark = pytest.mark.integration

FALSE_SIGNATURE = "sha256=" + "0" * 64
# The app's limits in the hostile scenario: 16 clients that each sent FIRST bytes hold more than BUDGET. The app
# admits a body while its declared length fits beside what is held, so in whatever order it meets the clients
# they hold at least (BUDGET - DECLARED) // FIRST firsts: what stays free, under FIRST + DECLARED - 1 bytes
# whichever the order, is less than a push (about 1.9 kB; the control asserts it). With DECLARED at 4000, clients
# met one by one left 3.2 kB, room for a push, and the control failed on an idle machine.
MAX_BODY, BUDGET, DECLARED, FIRST = 4096, 8192, 1100, 1000


@dataclass
class Dripper:
    """A connection declaring ``DECLARED`` bytes under a false signature: ``first`` bytes at once, then one per
    ``drip_s`` (none when ``drip_s`` is None) until the server answers or ``stop`` is set."""

    port: int
    first: int
    drip_s: float | None
    stop: threading.Event
    sent_first: threading.Event = field(default_factory=threading.Event)
    status_line: str = ""
    thread: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=60) as sock:
            head = (
                "POST /webhooks/github HTTP/1.1\r\nHost: specwatch.example\r\nContent-Type: application/json\r\n"
                f"Content-Length: {DECLARED}\r\nX-GitHub-Event: push\r\nX-GitHub-Delivery: drip-{id(self)}\r\n"
                f"X-Hub-Signature-256: {FALSE_SIGNATURE}\r\n\r\n"
            )
            sock.sendall(head.encode() + b"{" + b" " * (self.first - 1))
            self.sent_first.set()
            sent = self.first
            while not self.stop.is_set():
                readable, _, _ = select.select([sock], [], [], self.drip_s if self.drip_s is not None else 0.1)
                if readable:
                    answer = sock.recv(4096)
                    self.status_line = answer.split(b"\r\n", 1)[0].decode() if answer else "closed"
                    return
                if self.drip_s is not None and sent < DECLARED - 1:
                    sock.sendall(b" ")
                    sent += 1


@contextmanager
def drippers(port: int, count: int, *, first: int, drip_s: float | None) -> Iterator[list[Dripper]]:
    stop = threading.Event()
    clients = [Dripper(port, first, drip_s, stop) for _ in range(count)]
    try:
        yield clients
    finally:
        stop.set()
        for client in clients:
            client.thread.join(60)


def _pushes(port: int, count: int) -> list[int]:
    statuses = []
    for _ in range(count):
        content, headers = signed(SECRET, push_payload())
        answer = httpx.post(f"http://127.0.0.1:{port}/webhooks/github", content=content, headers=headers, timeout=30)
        statuses.append(answer.status_code)
    return statuses


def _hostile_app(tmp_path: Path) -> AbstractContextManager[Served]:
    """The app with a small body budget and deadlines long enough that dripping clients keep what they hold."""
    return served_webhooks(
        tmp_path,
        webhook_max_body_bytes=MAX_BODY,
        webhook_body_budget_bytes=BUDGET,
        webhook_body_deadline_s=120.0,
        webhook_body_read_timeout_s=60.0,
    )


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def test_without_the_proxy_dripping_clients_fill_the_app_budget_and_pushes_get_503(tmp_path: Path) -> None:
    """The control: the scenario is hostile enough to refuse pushes when the clients reach the app."""
    content, _ = signed(SECRET, push_payload())
    assert len(content) > BUDGET - FIRST * ((BUDGET - DECLARED) // FIRST), "a push would fit in what the clients leave"
    with _hostile_app(tmp_path) as served, drippers(_port(served.base), 16, first=FIRST, drip_s=1.0) as clients:
        wait_for(lambda: all(c.sent_first.is_set() for c in clients), timeout_s=30, what="16 clients sent their first bytes")
        # Each client either holds its first bytes in the budget or was refused (503) for want of room.
        settled = lambda: served.budget.held // FIRST + sum(1 for c in clients if c.status_line) == 16  # noqa: E731
        wait_for(settled, timeout_s=30, what="the budget filled")
        statuses = _pushes(_port(served.base), 5)
    assert 503 in statuses


def test_behind_the_proxy_dripping_clients_hold_nothing_of_the_app_and_every_push_is_accepted(tmp_path: Path) -> None:
    with (
        _hostile_app(tmp_path) as served,
        nginx_in_front(_port(served.base)) as proxy,
        drippers(proxy, 16, first=FIRST, drip_s=1.0) as clients,
    ):
        wait_for(lambda: all(c.sent_first.is_set() for c in clients), timeout_s=30, what="16 clients sent their first bytes")
        statuses = _pushes(proxy, 10)
        held = served.budget.held
        answered = [c.status_line for c in clients if c.status_line]
    assert statuses == [202] * 10
    assert held == 0, "the proxy passed dripping bodies on to the app before they were complete"
    assert answered == [], "the dripping clients should still be held by the proxy"


@pytest.mark.slow
def test_the_proxy_ends_a_stalled_body_at_its_read_timeout(tmp_path: Path) -> None:
    """Part of a body, then nothing: nginx ends the request after client_body_timeout (5 s; a 408 in its log, the
    connection closed without an answer), and the app never sees it."""
    with (
        served_webhooks(tmp_path) as served,
        nginx_in_front(_port(served.base)) as proxy,
        drippers(proxy, 4, first=10, drip_s=None) as clients,
    ):
        wait_for(lambda: all(c.status_line for c in clients), timeout_s=60, what="every stalled client answered")
        held = served.budget.held
        statuses = _pushes(proxy, 1)
    assert [c.status_line for c in clients] == ["closed"] * 4
    assert held == 0
    assert statuses == [202]


def test_the_proxy_body_limit_is_the_apps(tmp_path: Path) -> None:
    """A signed ping exactly at the app's default limit gets through the proxy; one byte more is refused there."""
    limit = Settings.model_fields["webhook_max_body_bytes"].default
    prefix = b'{"zen": "'
    with served_webhooks(tmp_path) as served, nginx_in_front(_port(served.base)) as proxy:
        base = f"http://127.0.0.1:{proxy}/webhooks/github"
        answers = []
        for size in (limit, limit + 1):
            body = prefix + b"z" * (size - len(prefix) - 2) + b'"}'
            content, headers = signed(SECRET, body, event="ping")
            answers.append(httpx.post(base, content=content, headers=headers, timeout=60))
    assert [a.status_code for a in answers] == [200, 413], [a.text[:200] for a in answers]
    assert answers[1].headers["server"] == "nginx"


def _directive(name: str) -> str:
    match = re.search(rf"^\s*{name}\s+(\S+);", SHIPPED.read_text(), re.MULTILINE)
    assert match, f"{SHIPPED} has no {name}"
    return match[1]


def _size(value: str) -> int:
    units = {"k": 1024, "m": 1024 * 1024}
    return int(value[:-1]) * units[value[-1]] if value[-1] in units else int(value)


@pytest.mark.unit
def test_the_shipped_proxy_limits_follow_the_app_defaults() -> None:
    defaults = {name: info.default for name, info in Settings.model_fields.items()}
    assert _directive("proxy_request_buffering") == "on"
    assert _size(_directive("client_max_body_size")) == defaults["webhook_max_body_bytes"]
    assert _size(_directive("client_body_buffer_size")) == defaults["webhook_spool_bytes"]
    assert float(_directive("client_body_timeout").removesuffix("s")) == defaults["webhook_body_read_timeout_s"]
    assert float(_directive("client_header_timeout").removesuffix("s")) == defaults["webhook_body_deadline_s"]
