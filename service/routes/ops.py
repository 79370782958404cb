"""Operations endpoints: ``/healthz`` (liveness and the database), ``/readyz`` (database and broker) and
Prometheus ``/metrics``.

``/metrics`` is collected at scrape time from the database (runs by status, alerts by kind and state, and what
:mod:`service.queries.operations` reads: runs waiting and running per target with the oldest's queue age, the
notification outbox's backlog and oldest row, each poll's failure and last poll, run and case durations, runs and
cases that failed by kind) and the broker (queue depth: the length of the Redis lists Celery keeps for the ``gpu``
and ``default`` queues), plus a histogram of webhook latency observed by :class:`WebhookTimer`, an ASGI
middleware. Each application has its own registry, so several apps in one process (tests) never clash.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import cast

import redis
from fastapi import APIRouter, Request, Response, status
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import text
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.auth import MetricsAuth
from service.deps import SessionDep, SettingsDep
from service.queries import alerts_by_state, operations, runs_by_status
from service.queue import CeleryProducer
from service.settings import Settings

log = logging.getLogger(__name__)

QUEUES = ("gpu", "default")
BROKER_TIMEOUT_S = 1.0
WEBHOOK_PATH = "/webhooks/github"

router = APIRouter(tags=["health"])


@router.get("/healthz", responses={503: {"description": "the database is unreachable"}})
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


def _redis_client(url: str) -> redis.Redis | None:
    """A client for a Redis broker URL with short timeouts; None for other brokers (``memory://`` when embedded)."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    return redis.Redis.from_url(url, socket_connect_timeout=BROKER_TIMEOUT_S, socket_timeout=BROKER_TIMEOUT_S)


def broker_reachable(url: str) -> bool | None:
    """Whether the Redis broker answers a PING within the timeout; None when the broker is not Redis."""
    client = _redis_client(url)
    if client is None:
        return None
    try:
        return bool(client.ping())
    except redis.RedisError as exc:
        log.warning("readyz broker_unreachable error=%s", exc)
        return False
    finally:
        client.close()


def broker_url(request: Request, settings: Settings) -> str:
    """The broker the app's producer publishes to (``memory://`` under ``specwatch serve``), else the setting."""
    producer = request.app.state.producer
    if isinstance(producer, CeleryProducer):
        return str(producer.celery.conf.broker_url)
    return settings.redis_url


@router.get("/readyz", responses={503: {"description": "the database or the broker is unreachable"}})
def readyz(request: Request, session: SessionDep, settings: SettingsDep, response: Response) -> dict[str, str]:
    """Readiness: the database answers a query and the broker a PING (1 s timeout each)."""
    checks: dict[str, str] = {}
    try:
        session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except SQLAlchemyError as exc:
        session.rollback()
        log.warning("readyz database_unreachable error=%s", exc)
        checks["database"] = "unreachable"
    broker = broker_reachable(broker_url(request, settings))
    checks["broker"] = "not redis (embedded)" if broker is None else ("ok" if broker else "unreachable")
    ready = "unreachable" not in checks.values()
    if not ready:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return {"status": "ok" if ready else "unavailable", **checks}


class StateCollector(Collector):
    """Queue depth and runs by status, read when Prometheus scrapes."""

    def __init__(self, session_factory: sessionmaker[Session], broker_url: str) -> None:
        self.session_factory = session_factory
        self.broker_url = broker_url

    def collect(self) -> Iterable[Metric]:
        yield from self._runs()
        yield from self._operations()
        yield from self._queues()

    def _operations(self) -> Iterator[Metric]:
        now = datetime.now(UTC)
        try:
            with self.session_factory() as session:
                queues, (backlog, oldest_unsent), polls = (
                    operations.queues(session),
                    operations.outbox_backlog(session, now),
                    operations.polls(session),
                )
                run_durations, case_durations = operations.run_durations(session), operations.case_durations(session)
                run_failures, case_failures = operations.run_failures(session), operations.case_failures(session)
        except SQLAlchemyError as exc:
            log.warning("metrics database_unreachable error=%s", exc)
            return
        yield from _queue_metrics(queues, now)
        yield from _outbox_metrics(backlog, oldest_unsent, now)
        yield from _poll_metrics(polls)
        runs = HistogramMetricFamily("specwatch_run_duration_seconds", "Duration of finished runs (every attempt)", labels=["status"])
        for run_status, histogram in run_durations.items():
            runs.add_metric([run_status], _buckets(histogram), histogram.total)
        yield runs
        cases = HistogramMetricFamily("specwatch_case_duration_seconds", "Duration of each stored case result")
        cases.add_metric([], _buckets(case_durations), case_durations.total)
        yield cases
        failures = GaugeMetricFamily("specwatch_run_failures", "Finished runs that did not pass, by kind", labels=["kind"])
        for kind, count in run_failures.items():
            failures.add_metric([kind], count)
        yield failures
        failing = GaugeMetricFamily("specwatch_case_failures", "Failing or erroring case results, by kind", labels=["kind"])
        for kind, count in case_failures.items():
            failing.add_metric([kind], count)
        yield failing

    def _runs(self) -> Iterator[Metric]:
        runs = GaugeMetricFamily("specwatch_runs", "Suite runs by status", labels=["status"])
        alerts = GaugeMetricFamily("specwatch_alerts", "Alerts by kind and state", labels=["kind", "state"])
        try:
            with self.session_factory() as session:
                run_counts, alert_counts = runs_by_status(session), alerts_by_state(session)
        except SQLAlchemyError as exc:
            log.warning("metrics database_unreachable error=%s", exc)
            return
        for run_status, count in run_counts.items():
            runs.add_metric([run_status.value], count)
        for (kind, state), count in alert_counts.items():
            alerts.add_metric([kind.value, state.value], count)
        yield runs
        yield alerts

    def _queues(self) -> Iterator[Metric]:
        client = _redis_client(self.broker_url)
        if client is None:
            return
        depth = GaugeMetricFamily("specwatch_queue_depth", "Messages waiting in the broker's queues", labels=["queue"])
        try:
            for queue in QUEUES:
                depth.add_metric([queue], float(client.llen(queue)))
        except redis.RedisError as exc:
            log.warning("metrics broker_unreachable error=%s", exc)
            return
        finally:
            client.close()
        yield depth


def _buckets(histogram: operations.Histogram) -> list[tuple[str, float]]:
    # Bounds written as prometheus_client writes its own histograms' ("60.0", "+Inf").
    return [("+Inf" if math.isinf(bound) else repr(bound), float(count)) for bound, count in histogram.buckets]


def _queue_metrics(queues: list[operations.QueueState], now: datetime) -> Iterator[Metric]:
    waiting = GaugeMetricFamily("specwatch_target_runs_waiting", "Runs of a target queued or running", labels=["target", "status"])
    age = GaugeMetricFamily(
        "specwatch_queue_oldest_age_seconds", "How long the oldest queued run of a target has waited (0: none waits)", labels=["target"]
    )
    for queue in queues:
        waiting.add_metric([queue.target, "queued"], queue.queued)
        waiting.add_metric([queue.target, "running"], queue.running)
        age.add_metric([queue.target], 0.0 if queue.oldest_queued_at is None else max(0.0, (now - queue.oldest_queued_at).total_seconds()))
    yield waiting
    yield age


def _outbox_metrics(backlog: dict[tuple[str, str], int], oldest: datetime | None, now: datetime) -> Iterator[Metric]:
    rows = GaugeMetricFamily(
        "specwatch_outbox_backlog", "Notifications not sent, by channel and state (due, deferred, given_up)", labels=["channel", "state"]
    )
    for (channel, state), count in sorted(backlog.items()):
        rows.add_metric([channel, state], count)
    yield rows
    age = GaugeMetricFamily("specwatch_outbox_oldest_age_seconds", "Age of the oldest notification still to send (0: none)")
    age.add_metric([], 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds()))
    yield age


def _poll_metrics(polls: list[operations.PollStatus]) -> Iterator[Metric]:
    failing = GaugeMetricFamily("specwatch_poll_failing", "1 when the last poll failed", labels=["target", "kind", "ref"])
    polled = GaugeMetricFamily(
        "specwatch_poll_last_polled_timestamp_seconds", "When the last poll started", labels=["target", "kind", "ref"]
    )
    succeeded = GaugeMetricFamily(
        "specwatch_poll_last_success_timestamp_seconds", "When a poll last succeeded", labels=["target", "kind", "ref"]
    )
    errors: dict[str, int] = {}
    for poll in polls:
        labels = [poll.target, poll.kind, poll.ref]
        failing.add_metric(labels, 1.0 if poll.failing else 0.0)
        errors[poll.target] = errors.get(poll.target, 0) + int(poll.failing)
        if poll.polled_at is not None:
            polled.add_metric(labels, poll.polled_at.timestamp())
        if poll.succeeded_at is not None:
            succeeded.add_metric(labels, poll.succeeded_at.timestamp())
    per_target = GaugeMetricFamily("specwatch_poll_errors", "Poll states of a target whose last poll failed", labels=["target"])
    for target, count in sorted(errors.items()):
        per_target.add_metric([target], count)
    yield from (failing, per_target, polled, succeeded)


def make_registry(session_factory: sessionmaker[Session], broker: str) -> tuple[CollectorRegistry, Histogram]:
    """A registry for one application: its state collector and its webhook latency histogram."""
    registry = CollectorRegistry()
    registry.register(StateCollector(session_factory, broker))
    latency = Histogram(
        "specwatch_webhook_latency_seconds",
        "Time to answer POST /webhooks/github",
        labelnames=["status"],
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        registry=registry,
    )
    return registry, latency


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, 401: {"description": "a token is required (SPECWATCH_METRICS_PUBLIC)"}},
    dependencies=[MetricsAuth],
)
def metrics(request: Request) -> Response:
    """Prometheus metrics: queue depth and age, runs by status, alerts by kind and state, the outbox's backlog, poll
    errors, run and case durations, failures by kind, webhook latency."""
    registry = cast(CollectorRegistry, request.app.state.metrics_registry)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class WebhookTimer:
    """ASGI middleware: observes the latency of every ``POST /webhooks/github`` by response status."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != WEBHOOK_PATH:
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        code = 500

        async def send_status(message: Message) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.histogram.labels(status=str(code)).observe(time.perf_counter() - start)
