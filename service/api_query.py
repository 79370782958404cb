"""The query API: a branch's commits, runs, one case over commits, two commits compared; alerts.

Every route answers from :mod:`service.queries`; unknown names are 404, bad input (cursor, limit, ambiguous
sha) 400. Reads need a token only when read auth is on (:mod:`service.auth`); acknowledging and resolving
alerts always need a write token. Case ids contain slashes
(``direct/far_apart/V8/g1``), hence the ``{case_id:path}`` route.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy.orm import Session

from service.auth import ReadAuth, WriteAuth
from service.deps import DbId, SessionDep
from service.models import AlertKind, AlertState
from service.queries import (
    MAX_HISTORY,
    MAX_PAGE,
    AlertRow,
    AlertStateError,
    CaseHistory,
    CommitPage,
    Comparison,
    NotFoundError,
    QueryError,
    RunDetail,
    TargetSummary,
    case_history,
    commits_page,
    compare,
    get_alert,
    list_alerts,
    run_detail,
    set_alert_state,
    targets_overview,
)

_ERRORS: dict[int | str, dict[str, str]] = {
    400: {"description": "bad cursor, limit or sha"},
    401: {"description": "reads need a token and none (or a bad one) was given"},
    404: {"description": "no such target, branch, run, case or commit"},
}

router = APIRouter(tags=["history"], dependencies=[ReadAuth], responses=_ERRORS)


def _http(exc: Exception) -> HTTPException:
    code = status.HTTP_404_NOT_FOUND if isinstance(exc, NotFoundError) else status.HTTP_400_BAD_REQUEST
    return HTTPException(code, str(exc))


@router.get("/overview")
def get_overview(session: SessionDep) -> list[TargetSummary]:
    """Every target with the head of each watched branch, its latest run's status, and its runs by status."""
    return targets_overview(session)


@router.get("/targets/{name}/commits")
def get_commits(
    name: str,
    session: SessionDep,
    branch: Annotated[str | None, Query(description="default: the target's first watched branch")] = None,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> CommitPage:
    """A branch's commits, newest first, each with its latest run's status; pages continue with ``cursor``."""
    try:
        return commits_page(session, name, branch=branch, cursor=cursor, limit=limit)
    except (NotFoundError, QueryError) as exc:
        raise _http(exc) from None


@router.get("/runs/{run_id}")
def get_run(run_id: DbId, session: SessionDep) -> RunDetail:
    """A run: its commit, environment, status and every case result."""
    try:
        return run_detail(session, run_id)
    except NotFoundError as exc:
        raise _http(exc) from None


@router.get("/targets/{name}/cases/{case_id:path}/history")
def get_case_history(
    name: str,
    case_id: str,
    session: SessionDep,
    branch: Annotated[str | None, Query(description="default: the target's first watched branch")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_HISTORY, description="the newest commits to include")] = 1000,
) -> CaseHistory:
    """One case over a branch's commits, oldest first, ready to plot: verdict, log e-value and threshold,
    TV estimate with its interval, acceptance observed and expected, fingerprint."""
    try:
        return case_history(session, name, case_id, branch=branch, limit=limit)
    except (NotFoundError, QueryError) as exc:
        raise _http(exc) from None


@router.get("/compare")
def get_compare(
    session: SessionDep,
    target: Annotated[str, Query(description="the target's name")],
    a: Annotated[str, Query(description="a commit sha (or a unique prefix)")],
    b: Annotated[str, Query(description="another commit sha (or a unique prefix)")],
) -> Comparison:
    """Two commits' latest runs compared case by case: verdicts, log e-values, acceptance difference (b - a)
    and whether the seeded output fingerprints are equal."""
    try:
        return compare(session, target, a, b)
    except (NotFoundError, QueryError) as exc:
        raise _http(exc) from None


# --- alerts ------------------------------------------------------------------------------------------------

alerts_router = APIRouter(tags=["alerts"], responses=_ERRORS)
_WRITE_ERRORS: dict[int | str, dict[str, str]] = {403: {"description": "a read-only token"}, 409: {"description": "not in that state"}}


@alerts_router.get("/alerts", dependencies=[ReadAuth])
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
        raise _http(exc) from None


@alerts_router.get("/alerts/{alert_id}", dependencies=[ReadAuth])
def get_one_alert(alert_id: DbId, session: SessionDep) -> AlertRow:
    """One alert with its failing cases."""
    try:
        return get_alert(session, alert_id)
    except NotFoundError as exc:
        raise _http(exc) from None


def _move(session: Session, alert_id: int, state: AlertState) -> AlertRow:
    try:
        return set_alert_state(session, alert_id, state, now=datetime.now(UTC))
    except AlertStateError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    except NotFoundError as exc:
        raise _http(exc) from None


@alerts_router.post("/alerts/{alert_id}/acknowledge", dependencies=[WriteAuth], responses=_WRITE_ERRORS)
def acknowledge_alert(alert_id: DbId, session: SessionDep) -> AlertRow:
    """open → acknowledged (a no-op when acknowledged; 409 when resolved)."""
    return _move(session, alert_id, AlertState.acknowledged)


@alerts_router.post("/alerts/{alert_id}/resolve", dependencies=[WriteAuth], responses=_WRITE_ERRORS)
def resolve_alert(alert_id: DbId, session: SessionDep) -> AlertRow:
    """open or acknowledged → resolved (a no-op when resolved). Sends no message."""
    return _move(session, alert_id, AlertState.resolved)
