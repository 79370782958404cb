"""The dashboard's forms: sign in with an API token, sign out, acknowledge and resolve an alert, re-run a commit.

Signing in checks the token like the API does (:func:`service.auth.token_scope`) and opens a server-side
session (:mod:`service.dashboard.session`); signing out revokes it. Acknowledging and resolving go through
:func:`service.queries.set_alert_state`, the function behind ``POST /alerts/{id}/acknowledge|resolve`` and
``specwatch alerts ack|resolve``, in the request's unit of work; a re-run through :func:`service.reruns.rerun_commit`
(as ``POST /targets/{name}/commits/{sha}/rerun``), sent to the workers after the commit. Each form needs the session's CSRF token;
the actions also need a session signed in with a write token. A refused form answers a page that says why,
with the matching status (401 not signed in or bad token, 403 bad CSRF token or read-only, 404, 409).
Forms answer ``303 See Other`` to the page they came from.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Form, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from service.after_commit import after_commit
from service.alerts import AlertStateError, set_alert_state
from service.auth import hash_token, token_scope
from service.dashboard import DASHBOARD_PATH, render_page
from service.dashboard.session import FormError, check_csrf, csrf_token, require_writer, safe_next, sign_in, sign_out
from service.deps import DbId, ProducerDep, SessionDep, app_settings
from service.ingest import RunOptions
from service.models import AlertState
from service.queries import NotFoundError, QueryError
from service.queue import enqueue_runs
from service.reruns import RunBusyError, rerun_commit

# The pages' one stylesheet, served from /ui/style.css (the CSP allows no inline style: service.headers).
STYLESHEET = (Path(__file__).parent / "style.css").read_bytes()

# No read auth here: the login page and the stylesheet must load before signing in, and the forms check the
# session themselves.
router = APIRouter(prefix=DASHBOARD_PATH, tags=["dashboard"], include_in_schema=False)

FormField = Annotated[str, Form()]


def _refused(request: Request, refused: FormError) -> HTMLResponse:
    return render_page(request, "refused.html", status_code=refused.status_code, message=refused.message)


def _see_other(location: str) -> RedirectResponse:
    return RedirectResponse(location, status_code=status.HTTP_303_SEE_OTHER)


@router.get("/style.css")
def stylesheet() -> Response:
    return Response(STYLESHEET, media_type="text/css", headers={"Cache-Control": "max-age=3600"})


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str = DASHBOARD_PATH) -> HTMLResponse:
    # The login form is CSRF-protected too (no one can sign a browser in with their own token): its token is
    # in the session from here on.
    return render_page(request, "login.html", next=safe_next(next), enabled=request.app.state.sign_in_enabled, csrf=csrf_token(request))


def _check_login(request: Request, token: str, csrf: str) -> None:
    check_csrf(request, csrf)
    if not request.app.state.sign_in_enabled:
        raise FormError(status.HTTP_503_SERVICE_UNAVAILABLE, "Sign-in is off on this server: set SPECWATCH_SESSION_SECRET.")
    if token_scope(app_settings(request), token) is None:
        raise FormError(status.HTTP_401_UNAUTHORIZED, "That is not a valid API token. Check it and try again.")


@router.post("/login", response_class=HTMLResponse, response_model=None)
def login(request: Request, session: SessionDep, token: FormField = "", csrf: FormField = "", next: FormField = DASHBOARD_PATH) -> Response:
    """Sign in: a server-side session of the token (by a keyed id, never the token) when it is a valid API token."""
    target = safe_next(next)
    try:
        _check_login(request, token.strip(), csrf)
    except FormError as refused:
        return render_page(
            request,
            "login.html",
            status_code=refused.status_code,
            next=target,
            enabled=request.app.state.sign_in_enabled,
            csrf=csrf_token(request),
            error=refused.message,
        )
    sign_in(request, session, hash_token(token.strip()), datetime.now(UTC))
    return _see_other(target)


@router.post("/logout", response_class=HTMLResponse, response_model=None)
def logout(request: Request, session: SessionDep, csrf: FormField = "") -> Response:
    """Sign out: the session is revoked on the server, then the cookie cleared."""
    try:
        check_csrf(request, csrf)
    except FormError as refused:
        return _refused(request, refused)
    sign_out(request, session, datetime.now(UTC))
    return _see_other(DASHBOARD_PATH)


def _move(request: Request, session: SessionDep, alert_id: int, *, state: AlertState, csrf: str, next: str | None) -> Response:
    try:
        require_writer(request, app_settings(request), csrf)
        set_alert_state(session, alert_id, state, now=datetime.now(UTC))
    except FormError as refused:
        return _refused(request, refused)
    except NotFoundError as exc:
        return _refused(request, FormError(status.HTTP_404_NOT_FOUND, f"{exc}."))
    except AlertStateError as exc:
        return _refused(request, FormError(status.HTTP_409_CONFLICT, f"{exc}."))
    return _see_other(safe_next(next or f"{DASHBOARD_PATH}/alerts/{alert_id}"))


@router.post("/alerts/{alert_id}/acknowledge", response_class=HTMLResponse, response_model=None)
def acknowledge(request: Request, alert_id: DbId, session: SessionDep, csrf: FormField = "", next: FormField = "") -> Response:
    """open → acknowledged, as ``POST /alerts/{id}/acknowledge`` does."""
    return _move(request, session, alert_id, state=AlertState.acknowledged, csrf=csrf, next=next)


@router.post("/alerts/{alert_id}/resolve", response_class=HTMLResponse, response_model=None)
def resolve(request: Request, alert_id: DbId, session: SessionDep, csrf: FormField = "", next: FormField = "") -> Response:
    """open or acknowledged → resolved, as ``POST /alerts/{id}/resolve`` does."""
    return _move(request, session, alert_id, state=AlertState.resolved, csrf=csrf, next=next)


@router.post("/targets/{name}/commits/{sha}/rerun", response_class=HTMLResponse, response_model=None)
def rerun(
    request: Request,
    name: str,
    sha: str,
    *,
    session: SessionDep,
    producer: ProducerDep,
    background: BackgroundTasks,
    csrf: FormField = "",
    reason: FormField = "",
) -> Response:
    """Test a commit again with the reason given, as ``POST /targets/{name}/commits/{sha}/rerun`` does; to the new run."""
    try:
        require_writer(request, app_settings(request), csrf)
        options = RunOptions.from_settings(app_settings(request))
        done = rerun_commit(session, name, sha, reason=reason, requested_by="dashboard", options=options)
    except FormError as refused:
        return _refused(request, refused)
    except NotFoundError as exc:
        return _refused(request, FormError(status.HTTP_404_NOT_FOUND, f"{exc}."))
    except RunBusyError as exc:
        return _refused(request, FormError(status.HTTP_409_CONFLICT, f"{exc}."))
    except QueryError as exc:
        return _refused(request, FormError(status.HTTP_400_BAD_REQUEST, f"{exc}."))
    after_commit(session, background.add_task, enqueue_runs, producer, [done.run_id])
    return _see_other(f"{DASHBOARD_PATH}/runs/{done.run_id}")
