"""Request dependencies: the app's settings, its queue producer, and a database session per request.

The session is the request's unit of work (docs/architecture.md §2): routes and the domain functions they call only
``add``/``flush``; the dependency commits after the route returned, and rolls back when it raised (an
``HTTPException`` included), so a rejected request stores nothing. It has ``scope="function"``: the commit
happens before the response is sent, so a failed commit is a 500, never an acknowledged request whose data
was lost; and background tasks (the enqueue after commit) run after the response, hence after the commit.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, cast

from fastapi import Depends, Path, Request
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.queue import Producer
from service.settings import Settings


def app_settings(request: Request) -> Settings:
    return cast(Settings, request.app.state.settings)


def app_producer(request: Request) -> Producer:
    return cast(Producer, request.app.state.producer)


def request_session(request: Request) -> Iterator[Session]:
    """A session that commits when the route returns and rolls back when it raises."""
    factory = cast(sessionmaker[Session], request.app.state.session_factory)
    with session_scope(factory) as session:
        yield session


def app_session_factory(request: Request) -> sessionmaker[Session]:
    return cast(sessionmaker[Session], request.app.state.session_factory)


#: Row ids are 32-bit integers (``Integer`` columns): a larger id in a path is a 422, never a database
#: overflow (SQLite raises OverflowError past 2**63 - 1).
MAX_ID = 2**31 - 1
DbId = Annotated[int, Path(ge=1, le=MAX_ID)]

SessionFactoryDep = Annotated[sessionmaker[Session], Depends(app_session_factory)]
SettingsDep = Annotated[Settings, Depends(app_settings)]
ProducerDep = Annotated[Producer, Depends(app_producer)]
SessionDep = Annotated[Session, Depends(request_session, scope="function")]
