"""The notification outbox of ``specwatch serve``, sent from its own thread, never behind a suite run.

The embedded worker runs one task at a time (:mod:`workers.embedded`): a ``workers.deliver_notifications`` message
queued behind a suite run waited for that run. So the "confirming" commit status, written when a failing run is
analysed, went out only after the confirmation run had finished, a tenth of a second before "failure"; and a
commit's ``pending`` status, written when its run was queued, went out after the run had passed (issue 26).

Under ``serve`` the messages that ask for a delivery (the analysis's, after it wrote notifications, and beat's
periodic one) go to their own in-memory queue, :data:`OUTBOX_QUEUE`, which the worker does not consume: this thread
does, and sends the due rows at once (:func:`workers.notify.deliver_due`, oldest first, one transaction per row).
A run queued for the workers wakes it too (its ``pending`` status was written in the same transaction). One thread
sends, so two senders never race on SQLite, which has no ``SKIP LOCKED``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from celery import signals
from kombu import Connection

from workers.celery_app import DELIVER_NOTIFICATIONS, RUN_SUITE
from workers.notify import DeliveryReport

log = logging.getLogger(__name__)

#: The in-memory queue of ``workers.deliver_notifications`` under ``serve``: consumed by :class:`OutboxSender` only.
OUTBOX_QUEUE = "outbox"
#: How long one wait for a message lasts before the thread looks at its wake-up flag and stop flag again.
WAIT_S = 0.1


class OutboxSender:
    """A daemon thread that sends the outbox whenever a delivery is asked for (see the module docstring).

    ``deliver`` sends up to a batch of due rows and says what it did; it is called again while it sends whole batches.
    """

    def __init__(self, broker_url: str, deliver: Callable[[], DeliveryReport], *, batch: int) -> None:
        self._broker_url = broker_url
        self._deliver = deliver
        self._batch = batch
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outbox-sender", daemon=True)
        self._ready = threading.Event()

    def start(self, timeout_s: float = 10.0) -> None:
        signals.after_task_publish.connect(self._on_publish, weak=False)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"the outbox sender did not start within {timeout_s:g} s")

    def stop(self, timeout_s: float = 10.0) -> None:
        signals.after_task_publish.disconnect(self._on_publish)
        self._stopping.set()
        self._thread.join(timeout_s)

    def wake(self) -> None:
        """Send the due rows now (the thread does it; this returns at once)."""
        self._wake.set()

    def _on_publish(self, sender: str | None = None, **_: Any) -> None:
        # A run queued: its pending status may be in the outbox. (Delivery messages arrive on the queue itself.)
        if sender == RUN_SUITE:
            self.wake()

    def _run(self) -> None:
        with Connection(self._broker_url, transport_options={"polling_interval": WAIT_S}) as connection:
            inbox = connection.SimpleQueue(OUTBOX_QUEUE)
            self._ready.set()
            try:
                while not self._stopping.is_set():
                    if self._take(inbox) or self._wake.is_set():
                        self._wake.clear()
                        self._send()
            finally:
                inbox.close()

    @staticmethod
    def _take(inbox: Any) -> bool:
        """Whether a delivery was asked for: every message waiting is taken (they all ask the same)."""
        asked = False
        try:
            message = inbox.get(block=True, timeout=WAIT_S)
            while True:
                message.ack()
                asked = True
                message = inbox.get_nowait()
        except queue.Empty:
            return asked

    def _send(self) -> None:
        try:
            while True:
                report = self._deliver()
                handled = len(report.sent) + len(report.deferred) + len(report.failed) + len(report.given_up)
                if handled < self._batch or self._stopping.is_set():
                    return
        except Exception:  # the database or a receiver failed: the rows stay due, the next wake retries
            log.exception("outbox_sender_failed")


def outbox_config(task_routes: dict[str, Any], beat_schedule: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What ``serve`` changes in the Celery configuration so that deliveries reach :class:`OutboxSender`: the
    route of ``workers.deliver_notifications`` and the queue of beat's entries that send it (copies: the production
    configuration is left as it is)."""
    routes = {**task_routes, DELIVER_NOTIFICATIONS: {"queue": OUTBOX_QUEUE}}
    schedule = {name: dict(entry) for name, entry in beat_schedule.items()}
    for entry in schedule.values():
        if entry.get("task") == DELIVER_NOTIFICATIONS:
            entry["options"] = {**entry.get("options", {}), "queue": OUTBOX_QUEUE}
    return {"task_routes": routes, "beat_schedule": schedule}
