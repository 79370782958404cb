"""What ``specwatch serve``, ``specwatch worker`` and ``specwatch beat`` run (their options: :mod:`service.cli.processes`).

The control plane never imports ``workers`` (import-linter), so :mod:`service.cli.processes` parses the options
and imports this module by name when one of these commands runs. Each function returns an exit status
(:class:`specwatch.protocol.ExitStatus`).

- ``serve``: the embedded default (:mod:`workers.embedded`): API, worker and beat in one process, SQLite,
  no Redis.
- ``worker`` and ``beat``: the production shape, Celery's own ``worker`` and ``beat`` on
  :data:`workers.celery_app.app` (broker: ``SPECWATCH_REDIS_URL``); extra arguments go to Celery unchanged.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from service import db
from service.settings import Settings, get_settings
from specwatch.protocol import ExitStatus
from workers import celery_app, embedded
from workers.settings import get_worker_settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)  # noqa: T201 -- the command line's own message
    return ExitStatus.USAGE


def _process_settings(database_url: str | None) -> Settings:
    """The process's settings, ``--database-url`` first: the tasks read the process's settings, not ours."""
    if database_url is not None:
        os.environ["SPECWATCH_DATABASE_URL"] = database_url
    for cached in (get_settings, get_worker_settings, db.session_factory):
        cached.cache_clear()
    if db.get_engine.cache_info().currsize:
        db.get_engine().dispose()
    db.get_engine.cache_clear()
    settings = get_settings()
    get_worker_settings()
    return settings


def served_url(host: str, port: int) -> str:
    """Where a browser on this machine reaches a service listening on ``host:port`` (all addresses: loopback)."""
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 -- naming the wildcard, not binding it
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(*, host: str, port: int, database_url: str | None = None) -> int:
    """The embedded service on ``host:port`` until interrupted. Unless SPECWATCH_DASHBOARD_URL says where the
    dashboard is, its links (Slack, commit statuses) point at this address and port (:func:`served_url`), not at the
    default port; with ``port`` 0 (any free port) the default stays."""
    try:
        settings = _process_settings(database_url)
        if "dashboard_url" not in settings.model_fields_set and port:
            os.environ["SPECWATCH_DASHBOARD_URL"] = served_url(host, port)
            settings = _process_settings(None)
    except ValidationError as exc:
        return _error(f"invalid settings: {exc}")
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        embedded.serve(settings, app=celery_app.app, host=host, port=port)
    except embedded.StartError as exc:
        return _error(str(exc))
    return ExitStatus.OK


def parse_queues(queues: str, known: Sequence[str]) -> list[str]:
    """``gpu,default`` as a list; every name must be one of ``known``."""
    names = [name.strip() for name in queues.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if not names or unknown:
        raise ValueError(f"unknown queue(s) {', '.join(unknown) or repr(queues)}; known: {', '.join(known)}")
    return names


def worker_argv(*, queues: Sequence[str], concurrency: int, loglevel: str, hostname: str | None, extra: Sequence[str]) -> list[str]:
    """Celery's ``worker`` arguments."""
    argv = ["worker", "--queues", ",".join(queues), "--concurrency", str(concurrency), "--loglevel", loglevel]
    if hostname is not None:
        argv += ["--hostname", hostname]
    return [*argv, *extra]


def beat_argv(*, schedule: Path | None, loglevel: str, extra: Sequence[str]) -> list[str]:
    """Celery's ``beat`` arguments."""
    argv = ["beat", "--loglevel", loglevel]
    if schedule is not None:
        argv += ["--schedule", str(schedule)]
    return [*argv, *extra]


def _celery(argv: list[str]) -> int:
    code: object = celery_app.app.start(argv)
    return code if isinstance(code, int) else ExitStatus.OK


def worker(*, queues: str, concurrency: int, loglevel: str = "INFO", hostname: str | None = None, extra: Sequence[str] = ()) -> int:
    """A production worker: ``celery worker`` consuming ``queues`` from the broker of ``SPECWATCH_REDIS_URL``."""
    try:
        _process_settings(None)
        names = parse_queues(queues, [queue.name for queue in celery_app.app.conf.task_queues])
    except ValueError as exc:  # pydantic's ValidationError included
        return _error(str(exc))
    if concurrency < 1:
        return _error(f"--concurrency must be at least 1, got {concurrency}")
    return _celery(worker_argv(queues=names, concurrency=concurrency, loglevel=loglevel, hostname=hostname, extra=extra))


def beat(*, schedule: Path | None = None, loglevel: str = "INFO", extra: Sequence[str] = ()) -> int:
    """The production scheduler: ``celery beat`` (one per deployment), sending housekeeping to ``default``."""
    try:
        _process_settings(None)
    except ValidationError as exc:
        return _error(str(exc))
    return _celery(beat_argv(schedule=schedule, loglevel=loglevel, extra=extra))
