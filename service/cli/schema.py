"""``specwatch db upgrade``: bring the database up to date (``alembic upgrade head``) from any folder.

The migrations ship inside the package (:mod:`service.schema`), so an installed server needs neither a checkout
nor ``alembic.ini``; compose's one-shot ``migrate`` service runs this command.
"""

from __future__ import annotations

from typing import Annotated

import typer
from sqlalchemy import make_url
from sqlalchemy.exc import SQLAlchemyError

from service.cli.database import UNAVAILABLE
from service.schema import SchemaError, upgrade_to_head
from service.settings import get_settings
from specwatch.cli.output import console, fail

db_app = typer.Typer(help="The database: bring its schema up to date.", no_args_is_help=True)


@db_app.command("upgrade")
def upgrade(
    database_url: Annotated[str | None, typer.Option(help="SQLAlchemy URL of the database (default: SPECWATCH_DATABASE_URL)")] = None,
) -> None:
    """Apply every migration the database lacks (nothing when it is up to date)."""
    url = database_url or get_settings().database_url
    shown = make_url(url).render_as_string(hide_password=True)
    try:
        upgrade_to_head(url)
    except SchemaError as exc:
        fail(str(exc), UNAVAILABLE)
    except SQLAlchemyError as exc:
        fail(f"cannot bring the database {shown} up to date: {getattr(exc, 'orig', None) or exc}", UNAVAILABLE)
    console.print(f"database {shown} is up to date")
