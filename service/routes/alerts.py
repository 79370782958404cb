"""Alerts: list, one, acknowledge, resolve. Reads need a token only when read auth is on; acknowledging and
resolving always need a write token."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy.orm import Session

from service.alerts import AlertStateError, set_alert_state
from service.auth import ReadAuth, WriteAuth
from service.deps import DbId, SessionDep
from service.models import AlertKind, AlertState
from service.queries import MAX_PAGE, AlertRow, NotFoundError, QueryError, get_alert, list_alerts
from service.routes.common import READ_ERRORS, http_error

router = APIRouter(tags=["alerts"], responses=READ_ERRORS)
_WRITE_ERRORS: dict[int | str, dict[str, str]] = {403: {"description": "a read-only token"}, 409: {"description": "not in that state"}}


@router.get("/alerts", dependencies=[ReadAuth])
def get_alerts(
    session: SessionDep,
    *,
    target: str | None = None,
    state: AlertState | None = None,
    kind: AlertKind | None = None,
    branch: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
) -> list[AlertRow]:
    """Alerts, newest first, filtered by target, state, kind and branch."""
    try:
        return list_alerts(session, target=target, state=state, kind=kind, branch=branch, limit=limit)
    except (NotFoundError, QueryError) as exc:
        raise http_error(exc) from None


@router.get("/alerts/{alert_id}", dependencies=[ReadAuth])
def get_one_alert(alert_id: DbId, session: SessionDep) -> AlertRow:
    """One alert with its failing cases."""
    try:
        return get_alert(session, alert_id)
    except NotFoundError as exc:
        raise http_error(exc) from None


def _move(session: Session, alert_id: int, state: AlertState) -> AlertRow:
    try:
        return set_alert_state(session, alert_id, state, now=datetime.now(UTC))
    except AlertStateError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    except NotFoundError as exc:
        raise http_error(exc) from None


@router.post("/alerts/{alert_id}/acknowledge", dependencies=[WriteAuth], responses=_WRITE_ERRORS)
def acknowledge_alert(alert_id: DbId, session: SessionDep) -> AlertRow:
    """open → acknowledged (a no-op when acknowledged; 409 when resolved)."""
    return _move(session, alert_id, AlertState.acknowledged)


@router.post("/alerts/{alert_id}/resolve", dependencies=[WriteAuth], responses=_WRITE_ERRORS)
def resolve_alert(alert_id: DbId, session: SessionDep) -> AlertRow:
    """open or acknowledged → resolved (a no-op when resolved). Sends no message."""
    return _move(session, alert_id, AlertState.resolved)
