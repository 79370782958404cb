"""Integration fixtures: real PostgreSQL (scratch databases, dropped at the end) and SQLite files.

Tests that only need tables use :func:`rolled_back_factory`: one migrated database per test process, each
test inside a transaction rolled back at the end. Tests that must see real commits create their own
database with :func:`create_migrated_postgres_database`.

PostgreSQL is ``SPECWATCH_TEST_POSTGRES_URL`` (default: the local server, user postgres, database
``test``); each scratch database is created from it as ``specwatch_test_<random>``. An unreachable server
fails the tests: integration tests never skip silently.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from service.db import make_engine

ROOT = Path(__file__).resolve().parents[2]
POSTGRES_URL = os.environ.get("SPECWATCH_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def postgres_admin() -> Iterator[Engine]:
    """An AUTOCOMMIT engine on the maintenance database, to create and drop scratch databases."""
    engine = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except OperationalError as exc:
        engine.dispose()
        pytest.fail(
            f"PostgreSQL is unreachable at {make_url(POSTGRES_URL).render_as_string(hide_password=True)} "
            f"(set SPECWATCH_TEST_POSTGRES_URL or start the server): {exc.orig}",
            pytrace=False,
        )
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def create_postgres_database(postgres_admin: Engine) -> Iterator[Callable[[], str]]:
    """A factory of empty scratch databases (``specwatch_test_<random>``); all are dropped at the end."""
    created: list[str] = []

    def create() -> str:
        name = f"specwatch_test_{secrets.token_hex(6)}"
        with postgres_admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        created.append(name)
        return make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)

    yield create
    with postgres_admin.connect() as connection:
        for name in created:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


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
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("sqlalchemy.url", empty_database_url.replace("%", "%%"))
    config.attributes["configure_logging"] = False
    return config


@pytest.fixture
def migrated_database_url(empty_database_url: str, alembic_config: Config) -> str:
    """An empty database on each backend, built the only way tables are built: ``alembic upgrade head``."""
    command.upgrade(alembic_config, "head")
    return empty_database_url


def migrate(url: str) -> None:
    """``alembic upgrade head`` on ``url``, leaving pytest's logging alone."""
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.attributes["configure_logging"] = False
    command.upgrade(config, "head")


@pytest.fixture(scope="session")
def create_migrated_postgres_database(create_postgres_database: Callable[[], str]) -> Callable[[], str]:
    """A factory of scratch PostgreSQL databases migrated to head (dropped at the end); returns the URL."""

    def create() -> str:
        url = create_postgres_database()
        migrate(url)
        return url

    return create


@pytest.fixture(scope="session")
def postgres_engine(create_migrated_postgres_database: Callable[[], str]) -> Iterator[Engine]:
    """An engine on a migrated scratch PostgreSQL database shared by the tests of one process; tests
    isolate themselves with :func:`rolled_back_factory` (or use a database of their own)."""
    engine = make_engine(create_migrated_postgres_database())
    yield engine
    engine.dispose()


@pytest.fixture
def rolled_back_factory(postgres_engine: Engine) -> Iterator[sessionmaker[Session]]:
    """Sessions inside one transaction that is rolled back after the test (STYLE.md #11): their commits
    release savepoints, so code under test commits as usual and the test leaves nothing behind."""
    with postgres_engine.connect() as connection:
        transaction = connection.begin()
        try:
            yield sessionmaker(bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False)
        finally:
            transaction.rollback()


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
