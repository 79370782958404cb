"""The queue producer: the control plane hands runs to the workers by id and by task name, after commit.

The service never imports ``workers`` (nor torch): a :class:`CeleryProducer` owns a Celery app that is used
only to ``send_task("workers.run_suite", args=[run_id], queue="gpu")``. Enqueueing happens after the
transaction that created the runs committed (docs/architecture.md §2, "Enqueue after commit"). A failed publish (Redis down) is logged and
swallowed: the run stays ``queued`` in the database, with a lease, and the sweeper (``workers.sweep_runs``)
re-enqueues it once its lease has expired, so nothing is lost.

Callers depend on the :class:`Producer` protocol, so tests substitute a recording fake or point a real
:class:`CeleryProducer` at a real (or unreachable) Redis.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

from celery import Celery

from service.settings import Settings

RUN_SUITE_TASK = "workers.run_suite"
SUITE_QUEUE = "gpu"

# One retry on a broken pooled connection (Redis restarted), then give up: the sweeper repairs the rest.
PUBLISH_RETRY_POLICY: dict[str, Any] = {"max_retries": 1, "interval_start": 0, "interval_step": 0.1, "interval_max": 0.2}
# An unreachable broker must not hold a web worker thread for long.
BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {"socket_connect_timeout": 2, "socket_timeout": 5}

log = logging.getLogger(__name__)


class Producer(Protocol):
    """Hands one run to the workers. Raises when the broker refuses; :func:`enqueue_runs` deals with that."""

    def send_run(self, run_id: int) -> None: ...


class CeleryProducer:
    """Publishes ``workers.run_suite`` messages to the ``gpu`` queue on the Celery broker at ``broker_url``."""

    def __init__(self, broker_url: str) -> None:
        self.celery = Celery("specwatch-service", broker=broker_url, set_as_current=False)
        self.celery.conf.update(
            task_serializer="json",
            accept_content=["json"],
            broker_transport_options=BROKER_TRANSPORT_OPTIONS,
            broker_connection_timeout=2,
        )

    def send_run(self, run_id: int) -> None:
        self.celery.send_task(RUN_SUITE_TASK, args=[run_id], queue=SUITE_QUEUE, retry=True, retry_policy=PUBLISH_RETRY_POLICY)

    def close(self) -> None:
        """Release the broker connections (application shutdown)."""
        self.celery.close()


def make_producer(settings: Settings) -> CeleryProducer:
    """The producer for ``settings``: its broker is ``settings.redis_url``."""
    return CeleryProducer(settings.redis_url)


def enqueue_runs(producer: Producer, run_ids: Iterable[int]) -> list[int]:
    """Send each run (already committed as ``queued``) to the workers; the ids actually sent.

    Call it only after the commit that created the runs. A broker error is logged, not raised: the runs
    it did not send stay ``queued`` in the database and the sweeper re-enqueues them when their lease
    expires. After the first failure the remaining runs are not tried (the broker is most likely down,
    and each try could wait for a connection timeout).
    """
    pending = list(run_ids)
    sent: list[int] = []
    for run_id in pending:
        try:
            producer.send_run(run_id)
        except Exception as exc:  # noqa: BLE001 -- any broker failure leaves the run to the sweeper
            log.warning(
                "enqueue_failed run_id=%s left_for_sweeper=%s error=%s: %s",
                run_id,
                pending[len(sent) :],
                type(exc).__name__,
                exc,
            )
            break
        sent.append(run_id)
    if sent:
        log.info("enqueued runs=%s queue=%s", sent, SUITE_QUEUE)
    return sent
