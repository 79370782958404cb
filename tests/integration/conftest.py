"""Integration fixtures beyond tests/support/postgres.py's: empty and migrated databases on each backend
(a fresh SQLite file, a fresh PostgreSQL database), for the tests of the migrations themselves, and
sessions on each backend for the code that must work on both (alerts, the notification outbox)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy.orm import Session, sessionmaker

from service.db import make_engine
from tests.support.postgres import alembic_config_for, migrate


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty database on each backend: a fresh SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'specwatch.db'}"
    create: Callable[[], str] = request.getfixturevalue("create_postgres_database")
    return create()


@pytest.fixture
def alembic_config(empty_database_url: str) -> Config:
    """The project's alembic.ini pointed at ``empty_database_url``, leaving pytest's logging alone."""
    return alembic_config_for(empty_database_url)


@pytest.fixture
def migrated_database_url(empty_database_url: str, alembic_config: Config) -> str:
    """An empty database on each backend, built the only way tables are built: ``alembic upgrade head``."""
    command.upgrade(alembic_config, "head")
    return empty_database_url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per test process; tests copy it."""
    path = tmp_path_factory.mktemp("sqlite-template") / "specwatch.db"
    migrate(f"sqlite:///{path}")
    return path


@pytest.fixture(params=["postgresql", "sqlite"])
def backend_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    """Sessions on each database the service supports: PostgreSQL (production) inside a transaction rolled
    back at the end, and a fresh migrated SQLite file (the embedded default of ``specwatch serve``)."""
    if request.param == "postgresql":
        yield request.getfixturevalue("rolled_back_factory")
        return
    path = tmp_path / "specwatch.db"
    shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
    engine = make_engine(f"sqlite:///{path}")
    try:
        yield sessionmaker(bind=engine, expire_on_commit=False)
    finally:
        engine.dispose()
