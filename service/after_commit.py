"""Work collected during a unit of work and done only once it has committed: publishing messages about its rows.

A message about rows (``workers.run_suite`` for a queued run, ``workers.analyse_run`` for a finished one) must
not reach a worker before those rows are visible, and must never be sent for rows that were rolled back
(docs/architecture.md §2, "Enqueue after commit"). The code that creates the rows registers the send on the
session instead of writing "commit, then publish" by hand::

    with session_scope(factory) as session:
        recorded = record_and_queue(session, ...)
        after_commit(session, enqueue_runs, producer, recorded.run_ids)
    # committed: enqueue_runs(producer, run_ids) has run; had the block raised, nothing would have been sent

The callbacks of a session run once, in the order they were registered, right after its outermost transaction
commits (a savepoint's release is not that commit). When that transaction ends any other way (a rollback, or
the session closed without committing) they are dropped unrun. A callback runs after the commit, so it must not
use the session; an exception it raises is logged and does not stop the callbacks after it, nor undo the commit.
A callback that publishes handles its own broker errors: the rows stay ``queued`` and the sweeper sends them
again (:func:`service.queue.enqueue_runs`). The Celery tasks use this through
``workers.task_base.SpecwatchTask.publish_after_commit``, in the spirit of warehouse's ``WarehouseTask``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import ParamSpec

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

log = logging.getLogger(__name__)

P = ParamSpec("P")

_CALLBACKS = "specwatch.after_commit"


def after_commit(session: Session, callback: Callable[P, object], /, *args: P.args, **kwargs: P.kwargs) -> None:
    """Call ``callback(*args, **kwargs)`` once ``session``'s transaction has committed; never if it does not.

    A session with no transaction open begins one, so the callback belongs to the unit of work that follows.
    """
    if not session.in_transaction():
        session.begin()
    session.info.setdefault(_CALLBACKS, []).append(partial(callback, *args, **kwargs))


def pending(session: Session) -> int:
    """How many callbacks wait for ``session``'s commit."""
    return len(session.info.get(_CALLBACKS, ()))


@event.listens_for(Session, "after_commit")
def _run_callbacks(session: Session) -> None:
    if session.in_nested_transaction():  # a savepoint released: the outer transaction may still roll back
        return
    for callback in session.info.pop(_CALLBACKS, []):
        try:
            callback()
        except Exception:
            log.exception("after_commit_failed callback=%r", callback)


@event.listens_for(Session, "after_transaction_end")
def _drop_callbacks(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:  # the outermost transaction ended; after a commit the list is empty
        dropped = session.info.pop(_CALLBACKS, [])
        if dropped:
            log.info("after_commit_dropped count=%s: the unit of work did not commit", len(dropped))
