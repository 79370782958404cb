"""The control plane's web application: ``create_app()`` builds it from one :class:`Settings`.

One engine per application (so per process), a session per request that commits at the boundary
(:mod:`service.deps`), and one queue producer. Tests pass their own settings, a session factory bound to
a rolled-back transaction, and a recording producer.

Run it with ``uvicorn --factory service.app:create_app``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Response, status
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from service import api, webhooks
from service.db import make_engine
from service.deps import SessionDep
from service.queue import CeleryProducer, Producer, make_producer
from service.settings import Settings, get_settings

log = logging.getLogger(__name__)


def create_app(
    settings: Settings | None = None,
    *,
    session_factory: sessionmaker[Session] | None = None,
    producer: Producer | None = None,
) -> FastAPI:
    """The application for ``settings`` (default: :func:`get_settings`).

    ``session_factory`` defaults to one bound to a new engine on ``settings.database_url``; ``producer`` to
    a Celery producer on ``settings.redis_url``. What the app builds itself it also disposes at shutdown.
    """
    settings = settings or get_settings()
    engine = None
    if session_factory is None:
        engine = make_engine(settings.database_url)
        session_factory = sessionmaker(bind=engine, expire_on_commit=False)
    owned_producer: CeleryProducer | None = None
    if producer is None:
        producer = owned_producer = make_producer(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if owned_producer is not None:
            owned_producer.close()
        if engine is not None:
            engine.dispose()

    app = FastAPI(title="specwatch", summary="Continuous monitoring of speculative-decoding losslessness", lifespan=lifespan)
    app.state.settings = settings
    app.state.session_factory = session_factory
    app.state.producer = producer

    @app.get("/healthz", tags=["health"], responses={503: {"description": "the database is unreachable"}})
    def healthz(session: SessionDep, response: Response) -> dict[str, str]:
        """Liveness and database reachability."""
        try:
            session.execute(text("SELECT 1"))
        except OperationalError as exc:
            session.rollback()
            log.warning("healthz database_unreachable error=%s", exc.orig)
            response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
            return {"status": "database unreachable"}
        return {"status": "ok"}

    app.include_router(webhooks.router)
    app.include_router(api.router)
    return app
