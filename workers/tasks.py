"""Celery tasks: thin wrappers that take ids, build the process's session factory and settings, and commit.

Every task is a :class:`workers.task_base.SpecwatchTask`: one retry policy (infrastructure errors only, with
backoff and a cap), and messages about rows sent from the unit of work that made them, after it commits
(:meth:`~workers.task_base.SpecwatchTask.publish_after_commit`, :func:`enqueue_after_commit`).

``workers.run_suite(run_id)`` executes one attempt of a run (:func:`workers.execution.execute_run`); an attempt
that could not install its release is retried with a countdown (the run's backoff, ``install_*`` worker settings);
``workers.sweep_runs()`` re-enqueues runs nobody is working on (:func:`workers.runs.sweep`);
``workers.poll_branches()`` and ``workers.poll_releases()`` turn new commits and releases of the due targets
into queued runs (:mod:`workers.pollers`), enqueued after their commit. All are idempotent; whatever a commit
or the suite does is recorded on the run, never retried.

``workers.analyse_run(run_id)`` analyses a finished run (:func:`workers.analysis.analyse`: confirmation,
bisection, drift, alerts), enqueued by ``run_suite`` when the run finished (and by the sweeper for a finished
run whose message was lost); ``workers.deliver_notifications()`` sends the outbox (:mod:`workers.notify`).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from service.after_commit import after_commit
from service.db import session_factory, session_scope
from service.ingest import RunOptions
from service.notifications.outbox import NotifyConfig
from service.queue import enqueue_runs
from service.repositories import RepoPolicy
from service.settings import Settings, get_settings
from workers import pollers
from workers.analysis import AnalysisConfig, analyse, unanalysed
from workers.celery_app import ANALYSE_RUN, DELIVER_NOTIFICATIONS, POLL_BRANCHES, POLL_RELEASES, RUN_SUITE, SWEEP_RUNS, app
from workers.checkout import MirrorCache
from workers.execution import execute_run, instance_folders
from workers.lease import utcnow
from workers.notify import deliver_due
from workers.runs import sweep
from workers.senders import Channels
from workers.settings import WorkerSettings, get_worker_settings
from workers.task_base import PUBLISH_RETRY_POLICY, SpecwatchTask

log = logging.getLogger(__name__)


@app.task(name=RUN_SUITE, bind=True, acks_late=True, reject_on_worker_lost=True)
def run_suite(self: SpecwatchTask, run_id: int) -> dict[str, Any]:
    """Execute one attempt of run ``run_id`` (a no-op when it is finished or held by a live worker).

    An attempt that could not install its release is queued again (committed by execute_run) and this task is
    retried after the run's backoff; the database counts those retries and ends the run ``uninstallable`` when
    they are spent (Celery's own count is only a backstop). Should the retry not reach the broker, the sweeper
    sends the run again once its lease (the retry time plus a grace) has passed.
    """
    worker = get_worker_settings()
    result = execute_run(run_id, factory=session_factory(), settings=worker)
    if result.status.finished:  # stored and committed by execute_run's own unit of work: analyse it
        analyse_run.publish(run_id)
    elif result.retry_in_s is not None:
        raise self.retry(countdown=result.retry_in_s, max_retries=self.max_retries + worker.install_retries)
    return {"run_id": result.run_id, "status": result.status.value, "reason": result.reason}


#: A finished run still unanalysed this long after it finished lost its analyse_run message: the sweeper
#: enqueues it again (runs older than the horizon are left alone: they predate the analysis).
ANALYSIS_GRACE = timedelta(minutes=10)
ANALYSIS_HORIZON = timedelta(days=2)


def analysis_config(settings: Settings, worker: WorkerSettings) -> AnalysisConfig:
    return AnalysisConfig(
        confirm_failures=worker.confirm_failures,
        drift_baseline_runs=worker.drift_baseline_runs,
        drift_alpha=worker.drift_alpha,
        notify=NotifyConfig(
            slack=settings.slack_webhook_url is not None and bool(settings.slack_webhook_url.get_secret_value()),
            github=settings.github_token is not None and bool(settings.github_token.get_secret_value()),
            dashboard_url=settings.dashboard_url,
        ),
    )


def channels(settings: Settings, worker: WorkerSettings) -> Channels:
    return Channels(
        slack_webhook_url=settings.slack_webhook_url.get_secret_value() if settings.slack_webhook_url else None,
        github_token=settings.github_token.get_secret_value() if settings.github_token else None,
        github_checks_token=settings.github_checks_token.get_secret_value() if settings.github_checks_token else None,
        github_api_url=settings.github_api_url,
        timeout_s=worker.notify_timeout_s,
        backoff_s=worker.notify_backoff_s,
        backoff_max_s=worker.notify_backoff_max_s,
        max_attempts=worker.notify_max_attempts,
    )


@app.task(name=ANALYSE_RUN, bind=True, acks_late=True)
def analyse_run(self: SpecwatchTask, run_id: int) -> dict[str, Any]:
    """Analyse finished run ``run_id`` once: classify, confirm, bisect, open or resolve alerts; enqueue new runs."""
    config = analysis_config(get_settings(), get_worker_settings())
    with session_scope(session_factory()) as session:
        report = analyse(session, run_id, config=config, now=utcnow())
        enqueue_after_commit(session, report.queued)
        if report.notifications:
            deliver_notifications.publish_after_commit(session)
    return report.as_dict()


@app.task(name=DELIVER_NOTIFICATIONS, bind=True)
def deliver_notifications(self: SpecwatchTask) -> dict[str, list[int]]:
    """Send the due rows of the notification outbox (Slack, GitHub statuses); see :mod:`workers.notify`."""
    worker = get_worker_settings()
    report = deliver_due(session_factory(), channels(get_settings(), worker), now=utcnow, limit=worker.notify_batch_size)
    return report.as_dict()


@app.task(name=SWEEP_RUNS, bind=True)
def sweep_runs(self: SpecwatchTask) -> dict[str, list[int]]:
    """Re-enqueue runs left queued past their lease or running under an expired one; give up after max attempts."""
    sent: list[int] = []
    with session_scope(session_factory()) as session:
        report = sweep(session, now=utcnow(), queued_lease_s=get_settings().queued_lease_s)
        for run_id in unanalysed(session, now=utcnow(), grace=ANALYSIS_GRACE, horizon=ANALYSIS_HORIZON) + report.gave_up:
            analyse_run.publish_after_commit(session, run_id)
        # A run is never enqueued before it is visibly queued again; those not sent wait for the next sweep.
        after_commit(session, lambda: sent.extend(_enqueue(report.requeued)))
    if report.requeued or report.gave_up:
        log.info("sweep requeued=%s gave_up=%s", sent, report.gave_up)
    return {"requeued": sent, "gave_up": report.gave_up}


class TaskProducer:
    """:class:`service.queue.Producer` for code running in a worker: publishes through this Celery app."""

    def send_run(self, run_id: int) -> None:
        run_suite.apply_async(args=(run_id,), retry=True, retry_policy=PUBLISH_RETRY_POLICY)


def _enqueue(run_ids: list[int]) -> list[int]:
    """Enqueue committed runs, the ids sent; a broker failure leaves the rest ``queued`` for the sweeper (logged)."""
    return enqueue_runs(TaskProducer(), run_ids)


def enqueue_after_commit(session: Session, run_ids: list[int]) -> None:
    """Enqueue ``run_ids`` once ``session``'s transaction has committed; never if it rolls back."""
    if run_ids:
        after_commit(session, _enqueue, run_ids)


@app.task(name=POLL_BRANCHES, bind=True)
def poll_branches(self: SpecwatchTask) -> dict[str, Any]:
    """Poll the watched branches of the due source targets (``git ls-remote``); queue runs for new commits."""
    worker = get_worker_settings()
    mirror_dir = instance_folders(session_factory(), worker).mirrors
    report = pollers.poll_branches(
        session_factory(),
        mirrors=MirrorCache(mirror_dir, git_timeout_s=worker.git_timeout_s, policy=RepoPolicy.from_settings(get_settings())),
        options=RunOptions.from_settings(get_settings()),
        enqueue=_enqueue,
        timeout_s=worker.poll_timeout_s,
    )
    if report.polled:
        log.info("poll_branches polled=%s runs=%s errors=%s", report.polled, report.run_ids, sorted(report.errors))
    return report.as_dict()


@app.task(name=POLL_RELEASES, bind=True)
def poll_releases(self: SpecwatchTask) -> dict[str, Any]:
    """Poll the package index for the due pip-installed targets; queue runs for new releases."""
    worker = get_worker_settings()
    report = pollers.poll_releases(
        session_factory(),
        index_url=worker.pypi_url,
        options=RunOptions.from_settings(get_settings()),
        enqueue=_enqueue,
        timeout_s=worker.poll_timeout_s,
        release_interval_s=worker.release_poll_interval_s,
        package_of=worker.release_package,
    )
    if report.polled:
        log.info("poll_releases polled=%s runs=%s errors=%s", report.polled, report.run_ids, sorted(report.errors))
    return report.as_dict()
