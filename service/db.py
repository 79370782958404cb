"""Engine once per process, a session per unit of work, commit at the boundary.

Domain functions take a :class:`~sqlalchemy.orm.Session` and ``add``/``flush``; only the boundary (a request
dependency, a task wrapper, :func:`session_scope`) commits, so two domain functions compose atomically.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, Insert, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from service.settings import get_settings


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """Per SQLite connection: enforce foreign keys (off by default) and use WAL so readers don't block the writer."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        # A busy writer makes others wait up to 5 s instead of failing at once with "database is locked".
        cursor.execute("PRAGMA busy_timeout=5000")
    finally:
        cursor.close()


#: Server pool: enough connections for the API's worker threads (40 by default under uvicorn/anyio),
#: and a short wait for one, after which the request is answered 503 instead of stalling.
POOL_OPTIONS: dict[str, Any] = {"pool_size": 10, "max_overflow": 30, "pool_timeout": 5}


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url``; SQLite connections get foreign keys and WAL."""
    options = {} if url.startswith("sqlite") else dict(POOL_OPTIONS)
    engine = create_engine(url, pool_pre_ping=True, **{**options, **kwargs})
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


@lru_cache(maxsize=1)
def get_engine() -> Engine:
    """The process's engine, built on first use from :func:`~service.settings.get_settings`."""
    return make_engine(get_settings().database_url)


def _forget_pooled_connections_in_child() -> None:
    """A forked child (Celery prefork) must not reuse its parent's pooled connections; it opens its own."""
    if get_engine.cache_info().currsize:
        get_engine().dispose(close=False)


os.register_at_fork(after_in_child=_forget_pooled_connections_in_child)


@lru_cache(maxsize=1)
def session_factory() -> sessionmaker[Session]:
    """The process's session factory, bound to :func:`get_engine`."""
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session] | None = None) -> Iterator[Session]:
    """One unit of work: commit when the block succeeds, roll back when it raises, close either way."""
    session = (factory or session_factory())()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def insert_ignoring_conflicts(
    session: Session, model: type[Any], values: dict[str, Any] | list[dict[str, Any]], keys: Sequence[Any]
) -> Insert | None:
    """``INSERT .. ON CONFLICT (keys) DO NOTHING`` of ``values`` into ``model``'s table, for the session's dialect.

    The idempotent insert of a row whose unique key may already exist (a redelivered webhook, a poll state a
    concurrent poller added, an alert two workers open): add ``.returning(...)`` to learn whether this insert
    made the row. None on a dialect without it (the caller falls back to reading first).
    """
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(model).values(values).on_conflict_do_nothing(index_elements=keys)
    if dialect == "sqlite":
        return sqlite.insert(model).values(values).on_conflict_do_nothing(index_elements=keys)
    return None
