"""``specwatch serve``, ``worker`` and ``beat``: the service's processes, run by :mod:`workers.cli`.

The control plane never imports ``workers`` (the import-linter contract: the API and its tests load no
Celery worker code); the ``specwatch`` console script is one entry point for both, so these commands parse
their options here and find the workers' commands through the entry point ``specwatch.processes`` -> ``workers``
(declared in ``pyproject.toml``, as the server's commands join the command line through ``specwatch.cli``).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Annotated

import typer

# Options that Celery's own CLI takes go through unchanged (e.g. `specwatch worker --pool solo --without-gossip`).
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


#: The entry point group naming the module that runs the service's processes (``serve``, ``worker``, ``beat``).
PROCESSES_GROUP = "specwatch.processes"


def _workers_cli() -> ModuleType:
    """The module registered as ``workers`` in :data:`PROCESSES_GROUP` (:mod:`workers.cli`), loaded when a service
    command runs (see the module docstring)."""
    found = entry_points(group=PROCESSES_GROUP, name="workers")
    if not found:
        raise RuntimeError(f"no {PROCESSES_GROUP} entry point 'workers': specwatch's package metadata is incomplete (reinstall it)")
    module: ModuleType = next(iter(found)).load()
    return module


def serve(
    host: Annotated[str, typer.Option(help="address the API listens on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port the API listens on (0: any free port)", min=0, max=65535)] = 8000,
    database_url: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL of the database (default: SPECWATCH_DATABASE_URL, else ./specwatch.db)")
    ] = None,
) -> None:
    """Run the whole service in one process: the API, a worker and the scheduler, no Redis needed.

    The database is migrated on start (SQLite by default). Runs execute one at a time in this process.
    Production runs `specwatch worker` and `specwatch beat` on Redis instead.
    """
    raise typer.Exit(_workers_cli().serve(host=host, port=port, database_url=database_url))


def worker(
    ctx: typer.Context,
    queues: Annotated[str, typer.Option("--queues", "-Q", help="queues to consume, comma-separated")] = "gpu,default",
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", help="tasks at a time (gpu: one per GPU)", min=1)] = 1,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
    hostname: Annotated[str | None, typer.Option("--hostname", "-n", help="node name, e.g. gpu-1@%h")] = None,
) -> None:
    """Run a Celery worker on the broker of SPECWATCH_REDIS_URL (production shape).

    Other options are Celery's (`celery worker --help`).
    """
    raise typer.Exit(_workers_cli().worker(queues=queues, concurrency=concurrency, loglevel=loglevel, hostname=hostname, extra=ctx.args))


def beat(
    ctx: typer.Context,
    schedule: Annotated[Path | None, typer.Option("--schedule", "-s", help="beat's schedule file")] = None,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
) -> None:
    """Run the scheduler (sweeper, pollers): exactly one per deployment (production shape).

    Other options are Celery's (`celery beat --help`).
    """
    raise typer.Exit(_workers_cli().beat(schedule=schedule, loglevel=loglevel, extra=ctx.args))
