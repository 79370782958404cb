"""Integration fixtures beyond tests/support/postgres.py's: empty and migrated databases on each backend
(a fresh SQLite file, a fresh PostgreSQL database), for the tests of the migrations themselves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config

from tests.support.postgres import alembic_config_for


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
