"""The control plane's web application: ``create_app()`` builds it from one :class:`Settings`.

One engine per application (so per process), a session per request that commits at the boundary
(:mod:`service.deps`), and one queue producer. Tests pass their own settings, a session factory bound to
a rolled-back transaction, and a recording producer.

Run it with ``uvicorn --factory service.app:create_app``.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker
from starlette.middleware.sessions import SessionMiddleware

from service import dashboard, routes
from service.dashboard.session import SESSION_COOKIE, SESSION_MAX_AGE_S, session_secret
from service.db import make_engine
from service.headers import SecurityHeaders
from service.logsafe import install_access_log_redaction, loggable
from service.queue import CeleryProducer, Producer, make_producer
from service.routes import ops
from service.settings import Settings, get_settings

log = logging.getLogger(__name__)
# What a 503 answer to a request that met an unreachable database asks the client to wait, in seconds.
DATABASE_RETRY_AFTER_S = 5


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

    # /docs (Swagger UI) and /redoc load their scripts and styles from the package (/static-offline-docs), not a
    # CDN: they work on a machine without internet.
    app = FastAPIOffline(title="specwatch", summary="Continuous monitoring of speculative-decoding losslessness", lifespan=lifespan)
    app.state.settings = settings
    app.state.session_factory = session_factory
    app.state.producer = producer
    registry, webhook_latency = ops.make_registry(
        session_factory, str(producer.celery.conf.broker_url) if isinstance(producer, CeleryProducer) else settings.redis_url
    )
    app.state.metrics_registry = registry
    app.add_middleware(ops.WebhookTimer, histogram=webhook_latency)
    # The dashboard's sign-in (service.dashboard.session): a signed cookie for /ui only. Without a key (no
    # SPECWATCH_SESSION_SECRET outside dev/test) sign-in is refused, and a throwaway key still lets pages read
    # their (empty) session.
    secret = session_secret(settings)
    app.state.sign_in_enabled = secret is not None
    # Signs the session cookie and keys the token ids of dashboard_sessions (service.dashboard.session.token_key).
    app.state.session_key = secret or secrets.token_urlsafe(32)
    app.add_middleware(
        SessionMiddleware,
        secret_key=app.state.session_key,
        session_cookie=SESSION_COOKIE,
        max_age=SESSION_MAX_AGE_S,
        path=dashboard.DASHBOARD_PATH,
        same_site="strict",
        https_only=settings.dashboard_url.startswith("https://"),
    )
    app.add_middleware(SecurityHeaders)
    install_access_log_redaction()

    @app.exception_handler(OperationalError)
    @app.exception_handler(PoolTimeoutError)
    async def database_unavailable(request: Request, exc: OperationalError | PoolTimeoutError) -> JSONResponse:
        """The database is down, restarting or has no free connection: 503 with ``Retry-After``, never a
        500 or a stall. The request's session rolled back (nothing half-stored); GitHub and other clients retry."""
        cause = type(exc.orig).__name__ if isinstance(exc, OperationalError) else "pool timeout"
        log.warning("database_unavailable path=%s error=%s", loggable(request.url.path), cause)
        return JSONResponse(
            {"detail": "the database is unavailable; retry later"},
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
        )

    app.include_router(routes.router)
    return app
