"""GitHub's rows for a primary run: its commit status (:mod:`.statuses`) and, where the target opted in, its check run
(:mod:`.check_runs`)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.models import Run
from service.notifications.check_runs import queue_check_run
from service.notifications.outbox import NotifyConfig
from service.notifications.statuses import queue_status


def queue_commit_status(session: Session, config: NotifyConfig, run: Run, status: str) -> int:
    """An outbox row for the GitHub commit status ``status`` (see :data:`service.notifications.statuses.STATUSES`) of
    primary run ``run``, and one for its check run when the target opted in (:mod:`service.notifications.check_runs`); the
    number of rows written (0 if not applicable)."""
    if not config.github:
        return 0
    written = queue_status(session, run, run.commit, status, config.dashboard_url)
    return written + queue_check_run(session, run, run.commit, status, config.dashboard_url)
