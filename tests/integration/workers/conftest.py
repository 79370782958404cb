"""Worker integration fixtures: a migrated PostgreSQL database, this process configured as a worker, a toy repo."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.support.toy_target import ToyRepo
from tests.support.workers import configured, flush_redis, migrate, session_maker, worker_environment


@pytest.fixture
def database_url(create_postgres_database: Callable[[], str]) -> str:
    url = create_postgres_database()
    migrate(url)
    return url


@pytest.fixture
def factory(database_url: str) -> Iterator[sessionmaker[Session]]:
    with session_maker(database_url) as made:
        yield made


@pytest.fixture
def worker_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, database_url: str) -> Iterator[dict[str, str]]:
    """This process configured as a worker on ``database_url`` and a flushed Redis database."""
    env = worker_environment(database_url, tmp_path, lease_s="30", heartbeat_s="1")
    flush_redis()
    with configured(monkeypatch, env):
        yield env
    flush_redis()


@pytest.fixture
def toy_repo(tmp_path: Path) -> ToyRepo:
    return ToyRepo.create(tmp_path / "toy")
