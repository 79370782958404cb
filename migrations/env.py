"""Alembic environment for specwatch: one set of migrations for PostgreSQL and SQLite.

The database URL is, in order: ``alembic -x url=...``; a ``sqlalchemy.url`` set on the Config (tests);
``SPECWATCH_DATABASE_URL`` through :func:`service.settings.get_settings`. Scripts are rendered in batch
mode, which SQLite needs to alter tables (it recreates them) and PostgreSQL executes as plain ALTERs.
"""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any, Literal

import sqlalchemy as sa
from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

from service.models import Base, UTCDateTime

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def database_url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from service.settings import get_settings  # noqa: PLC0415 -- settings only when no URL was given

    return get_settings().database_url


def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Render our UTCDateTime as the plain column type, so migrations never import application code."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
        render_item=render_item,
        **kwargs,
    )


def run_migrations_offline() -> None:
    """``alembic upgrade head --sql``: print the SQL instead of running it."""
    configure(url=database_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def check_sqlite_foreign_keys(connection: Connection) -> None:
    """Foreign keys are off while migrating SQLite (see below), so verify them before the transaction ends."""
    violations = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if violations:
        raise RuntimeError(f"migration left rows that violate foreign keys: {violations[:10]}")


def run_migrations_online() -> None:
    # A plain engine, not service.db's: SQLite must migrate with foreign keys OFF, since a batch
    # operation drops and recreates the table and with them ON that DROP cascades into child tables.
    engine = sa.create_engine(database_url(), poolclass=NullPool)
    try:
        with engine.connect() as connection:
            configure(connection=connection)
            with context.begin_transaction():
                context.run_migrations()
                if connection.dialect.name == "sqlite":
                    check_sqlite_foreign_keys(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
