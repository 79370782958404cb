"""The unit of work of the commands that use the database (``SPECWATCH_DATABASE_URL``).

Each command is one committed unit of work. Bad input (an invalid or duplicate target, nothing found) is one
line and :attr:`~specwatch.protocol.ExitStatus.USAGE`; an unreachable or unmigrated database is one line and
:data:`UNAVAILABLE`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import typer
from sqlalchemy import URL, make_url
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_factory, session_scope
from service.queries import NotFoundError, QueryError
from service.target_errors import TargetError
from specwatch.cli.output import fail
from specwatch.findings import FindingError
from specwatch.protocol import ExitStatus

#: The database is unreachable or not migrated (``targets``, ``history``, ``runs``, ``compare``, ``alerts``).
UNAVAILABLE: Final = 1


def _factory(ctx: typer.Context) -> sessionmaker[Session]:
    """The session factory: ``ctx.obj`` when a caller (a test) provides one, else the process's."""
    return ctx.obj if isinstance(ctx.obj, sessionmaker) else session_factory()


#: How to point a command at the database of a running ``specwatch serve``.
POINT_AT_IT = (
    "run the command in the folder where `specwatch serve` runs, or point SPECWATCH_DATABASE_URL at its database "
    "(e.g. sqlite:////abs/path/specwatch.db, or postgresql+psycopg://...); `specwatch db upgrade` creates a new one"
)


def sqlite_file(url: URL) -> Path | None:
    """The file of a SQLite URL (absolute), None for another database or an in-memory one."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:") or str(url.database).startswith("file:"):
        return None
    return Path(str(url.database)).expanduser().resolve()


def missing_database(url: URL) -> str | None:
    """Why a command must not open ``url``: a SQLite file that does not exist (opening it would create an empty
    database where the user expected the service's history); None when it may be opened."""
    path = sqlite_file(url)
    if path is None or path.exists():
        return None
    return f"no specwatch database at {path} (SPECWATCH_DATABASE_URL={url.render_as_string(hide_password=True)}): {POINT_AT_IT}"


@contextmanager
def unit_of_work(ctx: typer.Context) -> Iterator[Session]:
    """A committed unit of work; user errors exit 2, an unreachable database exits 1, both in one line.

    A SQLite database file that does not exist is refused before it is opened (SQLite would create it empty).
    """
    factory = _factory(ctx)
    url = make_url(str(factory.kw["bind"].engine.url))
    missing = missing_database(url)
    if missing is not None:
        fail(missing, UNAVAILABLE)
    try:
        with session_scope(factory) as session:
            yield session
    except (TargetError, FindingError) as exc:
        fail(str(exc), ExitStatus.USAGE)
    except (OperationalError, ProgrammingError) as exc:
        # Unreachable, or not migrated (`alembic upgrade head`): one line, never a traceback or a password.
        where = url.render_as_string(hide_password=True)
        detail = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]
        if "no such table" in detail or ("relation" in detail and "does not exist" in detail):
            fail(f"the database at {where} has no specwatch tables ({detail}): {POINT_AT_IT}", UNAVAILABLE)
        fail(f"database error at {where}: {detail}", UNAVAILABLE)


@contextmanager
def reading(ctx: typer.Context) -> Iterator[Session]:
    """:func:`unit_of_work` for the history commands: a missing target, run, case, commit or alert exits 2."""
    with unit_of_work(ctx) as session:
        try:
            yield session
        except (NotFoundError, QueryError) as exc:
            fail(str(exc), ExitStatus.USAGE)
