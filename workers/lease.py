"""An attempt's lease on its run, renewed by a heartbeat thread while the attempt works (fencing: :mod:`workers.runs`)."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from types import TracebackType

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from workers.runs import renew_lease

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


class LeaseLostError(Exception):
    """Another attempt took the run over (our lease expired): stop, store nothing."""


class Heartbeat:
    """Renews an attempt's lease every ``interval_s`` in a background thread until the block ends.

    ``lost`` is set when the attempt no longer holds the run. A database error only logs: the lease may then
    expire and the sweeper hand the run to another worker, which fencing makes safe. ``spawn_lock`` is held
    during each renewal, so a fork under it never copies a lock this thread holds.
    """

    def __init__(self, factory: sessionmaker[Session], run_id: int, attempt: int, *, lease_s: float, interval_s: float) -> None:
        self.factory, self.run_id, self.attempt = factory, run_id, attempt
        self.lease_s, self.interval_s = lease_s, interval_s
        self.lost = threading.Event()
        self.spawn_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-run-{run_id}", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self.spawn_lock:
                try:
                    with session_scope(self.factory) as session:
                        held = renew_lease(session, self.run_id, self.attempt, now=utcnow(), lease_s=self.lease_s)
                except DBAPIError as exc:
                    log.warning("heartbeat_failed run_id=%s attempt=%s error=%s", self.run_id, self.attempt, type(exc).__name__)
                    continue
            if not held:
                log.warning("lease_lost run_id=%s attempt=%s", self.run_id, self.attempt)
                self.lost.set()
                return

    def check(self) -> None:
        if self.lost.is_set():
            raise LeaseLostError(f"run {self.run_id}: attempt {self.attempt} lost its lease")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
