"""Fixtures of the security probes: the embedded default (a migrated SQLite file) behind the real app.

The probes of issue 14 were made on ``specwatch serve``: SQLite, the API, the dashboard and the webhook in one
process. :func:`embedded` builds the same app on a migrated SQLite file with a recording producer (the probes
are about what the web side does with hostile input); :func:`served` runs a real uvicorn process where the
probe is about the process (its access log, its memory).
"""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.auth import hash_token
from service.db import make_engine
from service.settings import Settings
from tests.support.postgres import migrate
from tests.support.private_servers import served_uvicorn, wait_for

ROOT = Path(__file__).resolve().parents[2]
SECRET = "probe-webhook-secret"
WRITE_TOKEN = "probe-write-token"
UNREACHABLE_REDIS_URL = "redis://127.0.0.1:1/0"


@dataclass
class RecordingProducer:
    sent: list[int] = field(default_factory=list)

    def send_run(self, run_id: int) -> None:
        self.sent.append(run_id)


@dataclass
class Embedded:
    client: TestClient
    factory: sessionmaker[Session]
    database: Path
    producer: RecordingProducer


def embedded_settings(database_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "env": "test",
        "database_url": database_url,
        "redis_url": UNREACHABLE_REDIS_URL,
        "webhook_secret": SecretStr(SECRET),
        "api_token_hashes": [hash_token(WRITE_TOKEN)],
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@contextmanager
def embedded_app(tmp_path: Path, **overrides: object) -> Iterator[Embedded]:
    """The app on a migrated SQLite file, as ``specwatch serve`` runs it, with settings ``overrides``."""
    database = tmp_path / "specwatch.db"
    url = f"sqlite:///{database}"
    migrate(url)
    engine = make_engine(url)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    producer = RecordingProducer()
    app = create_app(embedded_settings(url, **overrides), session_factory=factory, producer=producer)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            yield Embedded(client, factory, database, producer)
    finally:
        engine.dispose()


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Embedded]:
    with embedded_app(tmp_path) as app:
        yield app


@contextmanager
def served(env: Mapping[str, str], log_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``uvicorn --factory service.app:create_app`` on loopback with its access log on (``--log-level info``),
    configured by ``env``; its base URL and process."""
    with served_uvicorn(env, log_path, log_level="info") as served_process:
        yield served_process


@contextmanager
def served_in_thread(app: FastAPI) -> Iterator[str]:
    """``app`` served by uvicorn in a thread of this process (its state stays observable), on a port of
    127.0.0.1 bound here; its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), timeout_s=30, what="uvicorn")
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
