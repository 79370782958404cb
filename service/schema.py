"""The database schema, brought up to date from code: ``alembic upgrade head`` without the ``alembic`` command.

Alembic is the only way tables are created (migrations/; docs/architecture.md §4); ``specwatch serve`` calls :func:`upgrade_to_head`
on start, so the embedded default works on an empty SQLite file. The migrations are ``service/migrations``: in a
checkout a link to the repository's ``migrations/``, in an installed wheel a copy of it, so the same
configuration works from any folder. (``alembic.ini`` at the repository's root is for developers' ``alembic``
commands, e.g. ``alembic revision --autogenerate``; the server never reads it.)
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import make_url

log = logging.getLogger(__name__)

#: The Alembic environment and its versions, inside the ``service`` package.
MIGRATIONS = Path(__file__).resolve().parent / "migrations"


class SchemaError(RuntimeError):
    """The migrations cannot be found or applied; the message says why."""


def alembic_config(database_url: str) -> Config:
    """The project's Alembic configuration pointed at ``database_url``; the caller's logging is left alone."""
    if not (MIGRATIONS / "env.py").is_file():
        raise SchemaError(f"cannot find the migrations at {MIGRATIONS}: reinstall specwatch with the `server` extra")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("path_separator", "os")
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    config.attributes["configure_logging"] = False
    return config


def upgrade_to_head(database_url: str) -> None:
    """Apply every migration ``database_url`` lacks (a no-op when it is at head)."""
    log.info("schema_upgrade database=%s", make_url(database_url).render_as_string(hide_password=True))
    command.upgrade(alembic_config(database_url), "head")
