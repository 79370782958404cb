"""PostgreSQL fixtures (a pytest plugin, see tests/conftest.py): scratch databases on a real server.

PostgreSQL is ``SPECWATCH_TEST_POSTGRES_URL`` (default: the local server, user postgres, database ``test``);
each scratch database is created from it as ``specwatch_test_<random>`` and dropped at the end of the session.
An unreachable server fails the tests: integration tests never skip silently.

Migrating costs far more than copying, so each test process migrates one database once (``alembic upgrade
head``, the only way tables are built) and creates the migrated databases of its tests from it with
``CREATE DATABASE … TEMPLATE``:

- :func:`database_url`: a migrated database of the test's own, for code that commits through its own engine
  or in other processes (tasks, workers, the served app);
- :func:`rolled_back_factory`: sessions on one shared migrated database inside a transaction rolled back
  after the test (isolation by a rolled-back transaction, never by deleting rows), for code that takes a session factory;
- :func:`create_postgres_database`: an empty database, for the migrations' own tests.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from service.db import make_engine
from service.schema import alembic_config

ROOT = Path(__file__).resolve().parents[2]
POSTGRES_URL = os.environ.get("SPECWATCH_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def alembic_config_for(url: str) -> Config:
    """The server's own Alembic configuration (:func:`service.schema.alembic_config`) pointed at ``url``."""
    return alembic_config(url)


def migrate(url: str) -> None:
    """``alembic upgrade head`` on ``url``."""
    command.upgrade(alembic_config_for(url), "head")


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
            f"(set SPECWATCH_TEST_POSTGRES_URL or start the server; `make test` starts the local one): {exc.orig}",
            pytrace=False,
        )
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def create_postgres_database(postgres_admin: Engine) -> Iterator[Callable[..., str]]:
    """A factory of scratch databases (``specwatch_test_<random>``), empty or copied from ``template``; the
    URL of the new database. All are dropped at the end of the session."""
    created: list[str] = []

    def create(template: str | None = None) -> str:
        name = f"specwatch_test_{secrets.token_hex(6)}"
        copy = f' TEMPLATE "{template}"' if template else ""
        with postgres_admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"{copy}'))
        created.append(name)
        return make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)

    yield create
    with postgres_admin.connect() as connection:
        for name in reversed(created):  # copies before their template
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def migrated_template(create_postgres_database: Callable[..., str]) -> str:
    """The name of a database migrated to head once for this test process. Nothing stays connected to it
    (the migration's engine has no pool), which ``CREATE DATABASE … TEMPLATE`` requires; never use it directly."""
    url = create_postgres_database()
    migrate(url)
    database = make_url(url).database
    assert database is not None
    return database


@pytest.fixture(scope="session")
def create_migrated_postgres_database(create_postgres_database: Callable[..., str], migrated_template: str) -> Callable[[], str]:
    """A factory of scratch databases migrated to head (copies of :func:`migrated_template`); returns the URL."""

    def create() -> str:
        return create_postgres_database(migrated_template)

    return create


@pytest.fixture
def database_url(create_migrated_postgres_database: Callable[[], str]) -> str:
    """The URL of a migrated PostgreSQL database of this test's own."""
    return create_migrated_postgres_database()


@pytest.fixture(scope="session")
def postgres_engine(create_migrated_postgres_database: Callable[[], str]) -> Iterator[Engine]:
    """An engine on a migrated scratch PostgreSQL database shared by the tests of one process; tests
    isolate themselves with :func:`rolled_back_factory` (or use a database of their own)."""
    engine = make_engine(create_migrated_postgres_database())
    yield engine
    engine.dispose()


@pytest.fixture
def rolled_back_factory(postgres_engine: Engine) -> Iterator[sessionmaker[Session]]:
    """Sessions inside one transaction that is rolled back after the test (never by deleting rows): their commits
    release savepoints, so code under test commits as usual and the test leaves nothing behind."""
    with postgres_engine.connect() as connection:
        transaction = connection.begin()
        try:
            yield sessionmaker(bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False)
        finally:
            transaction.rollback()
