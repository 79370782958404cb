"""Slow bodies before authentication (issue 28, item 1): a client that drips a body under a false signature
holds one of the body slots only until the body deadline (or a read timeout), then gets 408 and the slot is
free for real deliveries.

The probe, over real HTTP against the app served by uvicorn: 8 connections (as many as there are slots) each
declare a 100 KB body with a well-formed but false ``X-Hub-Signature-256`` and send one byte at a time. Before
issue 28 they kept every signed push at 503 for as long as they dripped; now they lose their slots after the
(small, configured) deadline and a signed push gets through. ``bench/webhook_slow_clients.py`` prints the
figures (how long pushes stay refused) for the default settings.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import sessionmaker

from service.app import create_app
from service.db import make_engine
from service.webhooks import BodyBudget
from tests.security.conftest import SECRET, RecordingProducer, embedded_settings, served_in_thread
from tests.support.postgres import migrate
from tests.support.private_servers import wait_for
from tests.support.pushes import push_payload, signed

pytestmark = pytest.mark.integration

DECLARED = 100_000
FALSE_SIGNATURE = "sha256=" + "0" * 64


@dataclass
class Served:
    base: str
    budget: BodyBudget


@contextmanager
def served_webhooks(tmp_path: Path, **overrides: object) -> Iterator[Served]:
    """The app on a migrated SQLite file served by uvicorn in a thread, with its body budget we can watch."""
    url = f"sqlite:///{tmp_path / 'specwatch.db'}"
    migrate(url)
    engine = make_engine(url)
    app = create_app(
        embedded_settings(url, **overrides),
        session_factory=sessionmaker(bind=engine, expire_on_commit=False),
        producer=RecordingProducer(),
    )
    budget = app.state.webhook_body_budget = BodyBudget(app.state.settings.webhook_body_budget_bytes)
    try:
        with served_in_thread(app) as base:
            yield Served(base, budget)
    finally:
        engine.dispose()


@dataclass
class SlowClient:
    """One connection declaring a :data:`DECLARED`-byte body under a false signature, sending one byte per
    ``drip_s`` until the server answers (or ``stop`` is set); its answer's status line."""

    base: str
    drip_s: float | None
    stop: threading.Event
    status_line: str = ""
    thread: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        host, port = self.base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            head = (
                "POST /webhooks/github HTTP/1.1\r\n"
                f"Host: {host}\r\nContent-Type: application/json\r\nContent-Length: {DECLARED}\r\n"
                f"X-GitHub-Event: push\r\nX-GitHub-Delivery: slow-{id(self)}\r\nX-Hub-Signature-256: {FALSE_SIGNATURE}\r\n\r\n"
            )
            sock.sendall(head.encode() + b"{")
            sent = 1
            while not self.stop.is_set():
                # Wait up to drip_s for an answer; none yet: one more byte (a stalled client sends nothing).
                readable, _, _ = select.select([sock], [], [], self.drip_s if self.drip_s is not None else 0.1)
                if readable:
                    self.status_line = sock.recv(4096).split(b"\r\n", 1)[0].decode()
                    return
                if self.drip_s is not None and sent < DECLARED - 1:
                    sock.sendall(b" ")
                    sent += 1


@contextmanager
def slow_clients(base: str, count: int, *, drip_s: float | None) -> Iterator[list[SlowClient]]:
    stop = threading.Event()
    clients = [SlowClient(base, drip_s, stop) for _ in range(count)]
    try:
        yield clients
    finally:
        stop.set()
        for client in clients:
            client.thread.join(60)


def _push_until_accepted(base: str, *, timeout_s: float) -> list[int]:
    """Signed pushes, one after another, until one is accepted; the status of each."""
    statuses: list[int] = []

    def accepted() -> bool:
        content, headers = signed(SECRET, push_payload())
        statuses.append(httpx.post(f"{base}/webhooks/github", content=content, headers=headers, timeout=30).status_code)
        return statuses[-1] == 202

    wait_for(accepted, timeout_s=timeout_s, what="a signed push accepted")
    return statuses


def test_sixteen_dripping_clients_never_refuse_a_signed_push(tmp_path: Path) -> None:
    """Issue 42: 16 connections dripping a false-signed body (before, 8 slots: 17 of 25 pushes got 503). Each holds
    only the bytes it has sent, so every signed push sent while they all drip is accepted, and they still get 408
    at the deadline."""
    with (
        served_webhooks(tmp_path, webhook_body_deadline_s=60.0, webhook_body_read_timeout_s=30.0) as served,
        slow_clients(served.base, 16, drip_s=0.05) as clients,
    ):
        wait_for(lambda: served.budget.held >= 16 * 3, timeout_s=30, what="16 slow bodies dripping")
        statuses = []
        for _ in range(10):
            content, headers = signed(SECRET, push_payload())
            statuses.append(httpx.post(f"{served.base}/webhooks/github", content=content, headers=headers, timeout=30).status_code)
        still_dripping = not any(c.status_line for c in clients)
    assert statuses == [202] * 10
    assert still_dripping
    assert served.budget.held == 0


def test_dripping_clients_get_408_at_the_deadline(tmp_path: Path) -> None:
    with (
        served_webhooks(tmp_path, webhook_body_deadline_s=2.0, webhook_body_read_timeout_s=1.0) as served,
        slow_clients(served.base, 8, drip_s=0.05) as clients,
    ):
        wait_for(lambda: all(c.status_line for c in clients), timeout_s=30, what="every slow client answered")
    assert [c.status_line for c in clients] == ["HTTP/1.1 408 Request Timeout"] * 8
    assert served.budget.held == 0


def test_a_stalled_body_loses_its_slot_at_the_read_timeout(tmp_path: Path) -> None:
    """One byte, then nothing: the per-read timeout ends it long before the (here, large) deadline."""
    with (
        served_webhooks(tmp_path, webhook_body_deadline_s=300.0, webhook_body_read_timeout_s=0.5) as served,
        slow_clients(served.base, 8, drip_s=None) as clients,
    ):
        wait_for(lambda: all(c.status_line for c in clients), timeout_s=60, what="every stalled client answered")
        assert [c.status_line for c in clients] == ["HTTP/1.1 408 Request Timeout"] * 8
        assert served.budget.held == 0
        assert _push_until_accepted(served.base, timeout_s=30) == [202]


def test_a_signed_push_streamed_in_pieces_within_the_deadline_is_accepted(tmp_path: Path) -> None:
    content, headers = signed(SECRET, push_payload())
    with served_webhooks(tmp_path, webhook_body_deadline_s=30.0, webhook_body_read_timeout_s=10.0) as served:
        pieces = iter([content[i : i + 50] for i in range(0, len(content), 50)])
        answer = httpx.post(f"{served.base}/webhooks/github", content=pieces, headers=headers, timeout=30)
    assert answer.status_code == 202, answer.text
