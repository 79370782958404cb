"""The unit of work of the commands that use the database (``SPECWATCH_DATABASE_URL``).

Each command is one committed unit of work. Bad input (an invalid or duplicate target, nothing found) is one
line and :attr:`~specwatch.protocol.ExitStatus.USAGE`; an unreachable or unmigrated database is one line and
:data:`UNAVAILABLE`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import typer
from sqlalchemy import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_factory, session_scope
from service.queries import NotFoundError, QueryError
from service.targets import TargetError
from specwatch.cli.output import fail
from specwatch.findings import FindingError
from specwatch.protocol import ExitStatus

#: The database is unreachable or not migrated (``targets``, ``history``, ``runs``, ``compare``, ``alerts``).
UNAVAILABLE: Final = 1


def _factory(ctx: typer.Context) -> sessionmaker[Session]:
    """The session factory: ``ctx.obj`` when a caller (a test) provides one, else the process's."""
    return ctx.obj if isinstance(ctx.obj, sessionmaker) else session_factory()


@contextmanager
def unit_of_work(ctx: typer.Context) -> Iterator[Session]:
    """A committed unit of work; user errors exit 2, an unreachable database exits 1, both in one line."""
    factory = _factory(ctx)
    try:
        with session_scope(factory) as session:
            yield session
    except (TargetError, FindingError) as exc:
        fail(str(exc), ExitStatus.USAGE)
    except (OperationalError, ProgrammingError) as exc:
        # Unreachable, or not migrated (`alembic upgrade head`): one line, never a traceback or a password.
        url = make_url(str(factory.kw["bind"].url)).render_as_string(hide_password=True)
        detail = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]
        fail(f"database error at {url}: {detail}", UNAVAILABLE)


@contextmanager
def reading(ctx: typer.Context) -> Iterator[Session]:
    """:func:`unit_of_work` for the history commands: a missing target, run, case, commit or alert exits 2."""
    with unit_of_work(ctx) as session:
        try:
            yield session
        except (NotFoundError, QueryError) as exc:
            fail(str(exc), ExitStatus.USAGE)
