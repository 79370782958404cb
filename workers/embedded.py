"""The embedded default: ``specwatch serve`` runs the whole service in one process, on SQLite, without Redis.

One process holds the API (uvicorn), a Celery worker and Celery beat, each in its own thread. They run the
same code as the production shape (the webhook's producer, ``workers.run_suite``, ``workers.sweep_runs``,
every beat schedule entry); only the broker differs: kombu's in-memory transport (``memory://``), whose queues
live in this process and are shared by every connection in it. The producer (:class:`~service.queue.CeleryProducer`)
publishes to it, the worker consumes from it.

Why the in-memory broker, and not kombu's SQLAlchemy transport on a second SQLite file: nothing durable is
lost with it. The database is the queue of record: every run is a ``queued`` row before its message is
sent, so a message that dies with the process is repaired by :func:`resume_queued_runs` on the next start
(and by the sweeper after the run's lease); a run interrupted mid-way is re-queued by the sweeper once its
lease expires. The SQLAlchemy transport would add a polling writer on SQLite, contending with the API for the
database lock, for a durability the database already provides (it does not redeliver unacknowledged
messages either).

The notification outbox is sent by its own thread (:mod:`workers.embedded_outbox`), never behind a suite run: a
``workers.deliver_notifications`` message goes to a queue only that thread consumes.

After a restart, the runs still ``queued`` are sent again (:func:`resume_queued_runs`) and the runs that finished
but were never analysed (their ``workers.analyse_run`` message died with the previous process) are analysed at
once (:func:`resume_unanalysed_runs`), not after the sweeper's grace.

The worker runs one task at a time (``solo`` pool), consuming ``gpu`` and ``default``:

- no fork of this multi-threaded process (a prefork pool would fork uvicorn's threads' locks);
- a run's owner is its worker's ``host:pid`` (:func:`workers.execution.worker_identity`); two threads of one
  process running tasks at once would share it, so a duplicate message of a running run could claim it a
  second time. One task at a time makes that impossible;
- Celery cannot give two queues of one app separate consumers in one process (queue selection is per app),
  so housekeeping waits while a suite runs, which costs nothing here: there is no other worker to hand runs to.

Beat runs in a thread with Celery's in-memory scheduler (no schedule file): after a restart every entry is
due at once, which is harmless for idempotent housekeeping.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import uvicorn
from celery import Celery
from celery.beat import Scheduler, Service
from sqlalchemy import make_url, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from service import db
from service.app import create_app
from service.models import Run, RunStatus
from service.queue import CeleryProducer, Producer, enqueue_runs
from service.schema import SchemaError, upgrade_to_head
from service.settings import Settings
from workers.analysis import unanalysed
from workers.celery_app import ANALYSE_RUN, DEFAULT_QUEUE, GPU_QUEUE
from workers.embedded_outbox import OutboxSender, outbox_config
from workers.lease import utcnow
from workers.notify import deliver_due
from workers.settings import get_worker_settings
from workers.tasks import ANALYSIS_HORIZON, channels

log = logging.getLogger(__name__)

EMBEDDED_BROKER_URL = "memory://localhost/"
EMBEDDED_QUEUES = (GPU_QUEUE, DEFAULT_QUEUE)
# kombu's virtual transports poll an empty queue; the default (1 s) would add a second to every run's start.
POLLING_INTERVAL_S = 0.1
# How long a stopping worker may take to finish; a suite run still going after that is left to the sweeper.
STOP_GRACE_S = 10.0


class StartError(RuntimeError):
    """The embedded service cannot start (e.g. its database is unreachable); the message says why."""


def embedded_config() -> dict[str, Any]:
    """What the embedded worker changes in the Celery configuration (:func:`workers.celery_app.celery_config`)."""
    return {
        "broker_url": EMBEDDED_BROKER_URL,
        "broker_transport_options": {"polling_interval": POLLING_INTERVAL_S},
        # Task results are never read (the database holds the outcome); nothing to store them in without Redis.
        "result_backend": None,
        "task_ignore_result": True,
        # The process's logging is set up by `specwatch serve`, not taken over by Celery.
        "worker_hijack_root_logger": False,
    }


class EmbeddedWorker:
    """A Celery worker (``solo`` pool, queues ``gpu`` and ``default``) and beat, in daemon threads of this process."""

    def __init__(self, app: Celery[Any], *, hostname: str | None = None, loglevel: str = "INFO") -> None:
        self._ready = threading.Event()
        self.controller = app.WorkController(
            app=app,
            hostname=hostname or f"embedded@{socket.gethostname()}",
            pool="solo",
            concurrency=1,
            queues=list(EMBEDDED_QUEUES),
            loglevel=loglevel,
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            ready_callback=self._on_ready,
        )
        self._thread = threading.Thread(target=self.controller.start, name="celery-worker", daemon=True)
        # A tick at least every second, so that stopping beat takes a second at most.
        self.beat = Service(app, max_interval=1, scheduler_cls=Scheduler)
        self._beat_thread = threading.Thread(target=self.beat.start, name="celery-beat", daemon=True)

    def _on_ready(self, _consumer: Any) -> None:
        self._ready.set()

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the worker, wait until it consumes, then start beat."""
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"the embedded Celery worker did not start within {timeout_s:g} s")
        self._beat_thread.start()
        log.info("embedded_worker_started queues=%s broker=%s", ",".join(EMBEDDED_QUEUES), EMBEDDED_BROKER_URL)

    def stop(self, grace_s: float = STOP_GRACE_S) -> bool:
        """Stop beat, then the worker; ``False`` when a task was still running after ``grace_s``.

        Such a run is abandoned with this process (its suite subprocess dies with it, ``PR_SET_PDEATHSIG``);
        the sweeper re-queues it once its lease has expired.
        """
        if self._beat_thread.is_alive():
            self.beat.stop(wait=True)
        stopper = threading.Thread(target=self.controller.stop, kwargs={"in_sighandler": False}, name="celery-worker-stop", daemon=True)
        stopper.start()
        self._thread.join(grace_s)
        if self._thread.is_alive():
            log.warning("embedded_worker_abandoned grace_s=%s: a run in progress is re-queued after its lease", grace_s)
            return False
        return True


def resume_queued_runs(factory: sessionmaker[Session], producer: Producer) -> list[int]:
    """Send every ``queued`` run to the workers; the ids sent.

    The in-memory queue died with the previous process: its runs are still ``queued`` in the database.
    Sending one twice is harmless (``workers.run_suite`` is idempotent).
    """
    with factory() as session:
        run_ids = list(session.scalars(select(Run.id).where(Run.status == RunStatus.queued).order_by(Run.id)))
    if run_ids:
        log.info("resume_queued_runs runs=%s", run_ids)
    return enqueue_runs(producer, run_ids)


def resume_unanalysed_runs(factory: sessionmaker[Session], send: Callable[[int], object], *, now: datetime) -> list[int]:
    """Ask for the analysis of every finished run nobody analysed (within the sweeper's horizon); the ids asked.

    A run that finished while the previous process was stopping has its results stored but its ``analyse_run``
    message died with the in-memory queue; the sweeper would find it only after its grace (minutes). Analysing a
    run twice is harmless (``workers.analyse_run`` is idempotent).
    """
    with factory() as session:
        run_ids = unanalysed(session, now=now, grace=timedelta(0), horizon=ANALYSIS_HORIZON)
    for run_id in run_ids:
        send(run_id)
    if run_ids:
        log.info("resume_unanalysed_runs runs=%s", run_ids)
    return run_ids


def serve(settings: Settings, *, app: Celery[Any], host: str, port: int) -> None:
    """Migrate the database, start the worker and beat, and serve the API until SIGINT or SIGTERM.

    Raises :class:`StartError` when the database cannot be migrated.

    ``settings`` must be the process's settings (:func:`service.settings.get_settings`): the tasks read theirs.
    """
    try:
        upgrade_to_head(settings.database_url)
    except (SchemaError, SQLAlchemyError) as exc:
        where = make_url(settings.database_url).render_as_string(hide_password=True)
        raise StartError(f"cannot bring the database {where} up to date: {getattr(exc, 'orig', None) or exc}") from exc
    if not settings.webhook_secret.get_secret_value():
        log.warning("webhooks_disabled: SPECWATCH_WEBHOOK_SECRET is not set, POST /webhooks/github answers 401")
    app.conf.update(embedded_config())
    app.conf.update(outbox_config(dict(app.conf.task_routes or {}), dict(app.conf.beat_schedule or {})))
    factory = db.session_factory()
    producer = CeleryProducer(EMBEDDED_BROKER_URL)
    worker = EmbeddedWorker(app)
    worker_settings = get_worker_settings()
    outbox = OutboxSender(
        EMBEDDED_BROKER_URL,
        lambda: deliver_due(factory, channels(settings, worker_settings), now=utcnow, limit=worker_settings.notify_batch_size),
        batch=worker_settings.notify_batch_size,
    )
    # uvicorn handles SIGTERM as it does SIGINT, then raises it again with the previous handler once it
    # stopped: make that handler a KeyboardInterrupt (which uvicorn.run swallows), so the worker is stopped
    # below instead of the process being killed by the default action.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    outbox.start()
    worker.start()
    try:
        resume_queued_runs(factory, producer)
        resume_unanalysed_runs(factory, lambda run_id: app.send_task(ANALYSE_RUN, args=[run_id]), now=utcnow())
        outbox.wake()  # rows written before the restart
        web = create_app(settings, session_factory=factory, producer=producer)
        uvicorn.run(web, host=host, port=port, log_level="info")  # returns on SIGINT / SIGTERM
    finally:
        log.info("embedded_stopping")
        worker.stop()
        outbox.stop()
        producer.close()
        db.get_engine().dispose()
        log.info("embedded_stopped")
