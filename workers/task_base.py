"""The base class of every specwatch Celery task: one retry policy, and messages published after commit.

In the spirit of warehouse's ``WarehouseTask`` (``warehouse/tasks.py``): the policy lives on the class, so a
task states only what is its own (its name, ``acks_late``), and a task that sends another task while it holds
a unit of work registers the send on that session (:mod:`service.after_commit`), so nothing is published for a
transaction that rolls back and nothing reaches a worker before the rows it names are committed.

Retries are for infrastructure only (:data:`INFRASTRUCTURE_ERRORS`: the database or the broker unreachable or
dropping the connection), with exponential backoff, full jitter and a cap. A domain error (a bad commit, a
failing suite) is recorded on the run by the task itself and never retried.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

from service.after_commit import after_commit

log = logging.getLogger(__name__)

#: Errors worth retrying: the database or the broker is unreachable or dropped the connection.
INFRASTRUCTURE_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError, BrokerError, ConnectionError)
#: Publishing one message: a broken pooled connection is retried briefly, then the publisher gives up and the
#: sweeper (or beat's next tick) sends it again.
PUBLISH_RETRY_POLICY: dict[str, Any] = {"max_retries": 2, "interval_start": 0, "interval_step": 0.5, "interval_max": 1}


class SpecwatchTask(Task[Any, Any]):
    """A specwatch task: retried on :data:`INFRASTRUCTURE_ERRORS` only, at most 5 times, waiting about 2, 4, 8,
    16 then 32 s (full jitter, never over 120 s); see the module docstring."""

    autoretry_for = INFRASTRUCTURE_ERRORS
    max_retries = 5
    retry_backoff = 2
    retry_backoff_max = 120
    retry_jitter = True

    def publish(self, *args: Any) -> bool:
        """Send this task with ``args`` now; a broker failure is logged and ``False`` (the sweeper or beat repairs it)."""
        try:
            self.apply_async(args=args, retry=True, retry_policy=PUBLISH_RETRY_POLICY)
        except INFRASTRUCTURE_ERRORS as exc:
            log.warning("publish_failed task=%s args=%s error=%s: %s", self.name, args, type(exc).__name__, exc)
            return False
        return True

    def publish_after_commit(self, session: Session, *args: Any) -> None:
        """:meth:`publish` once ``session``'s transaction has committed; never if it rolls back."""
        after_commit(session, self.publish, *args)
