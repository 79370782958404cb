"""Alerts moved by hand: acknowledged or resolved (the analysis opens, updates and resolves them itself)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Alert, AlertState
from service.queries.alerts import AlertRow, alert_rows
from service.queries.common import NotFoundError, QueryError


class AlertStateError(QueryError):
    """The alert cannot move to the asked state (a resolved alert cannot be acknowledged)."""


def set_alert_state(session: Session, alert_id: int, state: AlertState, *, now: datetime) -> AlertRow:
    """Acknowledge (open → acknowledged) or resolve (open/acknowledged → resolved) an alert by hand.

    Asking for the state it is in is a no-op; acknowledging a resolved alert is an :class:`AlertStateError`.
    Flushes, never commits. Resolving by hand sends no message (the analysis worker's automatic resolution does).
    """
    alert = session.scalars(select(Alert).where(Alert.id == alert_id).with_for_update()).one_or_none()
    if alert is None:
        raise NotFoundError(f"no alert {alert_id}")
    if alert.state is not state:
        if state is AlertState.acknowledged:
            if alert.state is not AlertState.open:
                raise AlertStateError(f"alert {alert_id} is {alert.state.value}: only an open alert can be acknowledged")
            alert.acknowledged_at = now
        elif state is AlertState.resolved:
            alert.resolved_at = now
        else:
            raise AlertStateError(f"alert {alert_id} cannot be reopened by hand")
        alert.state = state
        session.flush()
    return alert_rows(session, [alert])[0]
