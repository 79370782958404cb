"""The Celery application of the workers: ``celery -A workers.celery_app worker -Q gpu,default``.

Configured lazily from the control plane's settings (broker and result backend: ``settings.redis_url``) and
the worker's own (:mod:`workers.settings`) the first time the configuration is read, never at import time.

Queues: ``gpu`` runs the suite (``workers.run_suite``: one task per process at a time, acknowledged only when
it ends, re-queued if its process dies, time limits below Redis' visibility timeout, recycled processes);
``default`` runs housekeeping (``workers.sweep_runs``, every ``sweep_interval_s`` from beat) and the pollers
(``workers.poll_branches``, ``workers.poll_releases``, every ``poll_interval_s``; each target's own interval
decides whether it is polled), the analysis of finished runs (``workers.analyse_run``) and the notification
outbox (``workers.deliver_notifications``, every ``notify_interval_s``). Start a GPU
worker with ``-Q gpu -c 1`` per GPU and a housekeeping worker with ``-Q default``, plus one ``celery beat``.

A worker of the ``gpu`` queue that must isolate the suite (``SPECWATCH_WORKER_SANDBOX=bwrap`` or ``uid``) probes
the sandbox before it starts and refuses to start, with the reason on one line, when it cannot isolate: else
every run it took would end in ``error`` (a deployment problem shown as broken commits).
"""

from __future__ import annotations

import subprocess
from typing import Any

from celery import Celery, signals
from kombu import Queue

from service.settings import Settings, get_settings
from workers.settings import WorkerSettings, get_worker_settings
from workers.task_base import SpecwatchTask

GPU_QUEUE = "gpu"
DEFAULT_QUEUE = "default"
RUN_SUITE = "workers.run_suite"
SWEEP_RUNS = "workers.sweep_runs"
POLL_BRANCHES = "workers.poll_branches"
POLL_RELEASES = "workers.poll_releases"
ANALYSE_RUN = "workers.analyse_run"
DELIVER_NOTIFICATIONS = "workers.deliver_notifications"


def celery_config(settings: Settings, worker: WorkerSettings) -> dict[str, Any]:
    """The whole Celery configuration, as a plain dict (tested without a broker)."""
    transport = {"visibility_timeout": worker.visibility_timeout_s}
    # A poll may clone a mirror (git_timeout_s) before reading it; a stuck one is stopped well before beat
    # has queued many more (expired ticks are dropped).
    poll_limit = worker.git_timeout_s + 10 * worker.poll_timeout_s
    return {
        "broker_url": settings.redis_url,
        "result_backend": settings.redis_url,
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_expires": 24 * 3600,
        "timezone": "UTC",
        "enable_utc": True,
        "task_queues": (Queue(GPU_QUEUE), Queue(DEFAULT_QUEUE)),
        "task_default_queue": DEFAULT_QUEUE,
        "task_routes": {
            RUN_SUITE: {"queue": GPU_QUEUE},
            SWEEP_RUNS: {"queue": DEFAULT_QUEUE},
            POLL_BRANCHES: {"queue": DEFAULT_QUEUE},
            POLL_RELEASES: {"queue": DEFAULT_QUEUE},
            ANALYSE_RUN: {"queue": DEFAULT_QUEUE},
            DELIVER_NOTIFICATIONS: {"queue": DEFAULT_QUEUE},
        },
        # One reserved message per process: a long suite run never holds a second one hostage.
        "worker_prefetch_multiplier": 1,
        "worker_max_tasks_per_child": worker.max_tasks_per_child,
        # A running task keeps going if the broker connection drops: its lease in the database, not the
        # message, decides who owns the run, and results are fenced by attempt.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # Time limits come from settings, so they are annotations (read with the configuration), not decorator
        # arguments (fixed at import).
        "task_annotations": {
            RUN_SUITE: {"soft_time_limit": worker.task_soft_time_limit_s, "time_limit": worker.task_time_limit_s},
            SWEEP_RUNS: {"soft_time_limit": 120, "time_limit": 180},
            POLL_BRANCHES: {"soft_time_limit": poll_limit, "time_limit": poll_limit + 60},
            POLL_RELEASES: {"soft_time_limit": poll_limit, "time_limit": poll_limit + 60},
            ANALYSE_RUN: {"soft_time_limit": 120, "time_limit": 180},
            # One pass sends at most notify_batch_size messages, each bounded by notify_timeout_s.
            DELIVER_NOTIFICATIONS: {
                "soft_time_limit": worker.notify_batch_size * (worker.notify_timeout_s + 1) + 30,
                "time_limit": worker.notify_batch_size * (worker.notify_timeout_s + 1) + 90,
            },
        },
        "beat_schedule": {
            "sweep-runs": {
                "task": SWEEP_RUNS,
                "schedule": worker.sweep_interval_s,
                "options": {"queue": DEFAULT_QUEUE, "expires": worker.sweep_interval_s},
            },
            "poll-branches": {
                "task": POLL_BRANCHES,
                "schedule": worker.poll_interval_s,
                "options": {"queue": DEFAULT_QUEUE, "expires": worker.poll_interval_s},
            },
            "poll-releases": {
                "task": POLL_RELEASES,
                "schedule": worker.poll_interval_s,
                "options": {"queue": DEFAULT_QUEUE, "expires": worker.poll_interval_s},
            },
            "deliver-notifications": {
                "task": DELIVER_NOTIFICATIONS,
                "schedule": worker.notify_interval_s,
                "options": {"queue": DEFAULT_QUEUE, "expires": worker.notify_interval_s},
            },
        },
    }


#: Every task is a :class:`~workers.task_base.SpecwatchTask`: one retry policy, publishing after commit.
app: Celery[SpecwatchTask] = Celery("specwatch", include=["workers.tasks"], task_cls=SpecwatchTask)


@app.on_configure.connect
def _configure(sender: Celery, **_: Any) -> None:
    sender.config_from_object(celery_config(get_settings(), get_worker_settings()))


@signals.celeryd_init.connect
def _refuse_to_start_without_isolation(options: dict[str, Any] | None = None, **_: Any) -> None:
    queues = (options or {}).get("queues") or [GPU_QUEUE]  # no -Q: every queue
    settings = get_worker_settings()
    if GPU_QUEUE not in (queues.split(",") if isinstance(queues, str) else queues) or settings.sandbox not in ("bwrap", "uid"):
        return
    from workers.execution import sandbox_of  # noqa: PLC0415 -- the suite's side, only in a worker process

    try:
        sandbox_of(settings)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        # SystemExit passes through Celery's signal dispatch: the worker exits 1 with this line on stderr.
        raise SystemExit(f"specwatch worker not started: it cannot isolate the suite: {exc} (docs/deployment.md)") from None
