"""Who is looking at the dashboard: a server-side session named by a random id in a signed cookie, and CSRF tokens.

Signing in means presenting an API token once (the login form). That makes a row of ``dashboard_sessions``
(:class:`service.models.DashboardSession`): the SHA-256 of a random session id, which token signed in by a
keyed id (:func:`token_key`, HMAC-SHA256 under the session secret: neither the token nor its plain digest),
and when the session began and ends (:data:`SESSION_MAX_AGE_S`). The cookie holds the session id and the
CSRF token only, signed by Starlette's ``SessionMiddleware`` (itsdangerous, key ``SPECWATCH_SESSION_SECRET``),
``HttpOnly``, ``SameSite=Strict``, scoped to ``/ui``, ``Secure`` when the dashboard is served over HTTPS.

Every request looks the row up (:func:`viewer`): a session signed out, expired, or whose token is no longer
configured counts for nothing. Sign-out revokes the row, so a cookie saved before it is worthless after it;
a token removed from the configuration revokes its sessions when they are next seen, for good (adding the
token back does not revive them). Issue 28, item 5: the cookie used to carry the token's SHA-256 and lived
on after sign-out.

Every form that changes something carries the session's CSRF token (synchronizer token pattern): a random
value kept in the session and echoed in a hidden field, compared in constant time. A form from another
site cannot know it; ``SameSite=Strict`` would keep the cookie off such a request anyway.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from fastapi import Depends, HTTPException, Request, status
from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session

from service.auth import BearerCredentials, Scope, require_read
from service.db import session_scope
from service.deps import SettingsDep, app_session_factory
from service.models import DashboardSession
from service.settings import Environment, Settings

SESSION_COOKIE = "specwatch_session"
SESSION_MAX_AGE_S = 8 * 60 * 60
CSRF_KEY, SESSION_ID_KEY = "csrf", "sid"
SIGNED_OUT, TOKEN_REVOKED = "signed out", "token revoked"
# Rows of sessions that ended longer ago than this are deleted at the next sign-in.
KEEP_ENDED = timedelta(days=7)


@dataclass(frozen=True)
class Viewer:
    """The dashboard's view of a request: signed in or not, may write or not, and the CSRF token for forms."""

    scope: Scope | None
    csrf: str

    @property
    def signed_in(self) -> bool:
        return self.scope is not None

    @property
    def can_write(self) -> bool:
        return self.scope is Scope.write


def session_secret(settings: Settings) -> str | None:
    """The key that signs session cookies; ``None`` when sign-in is off (no secret outside dev/test).

    In dev and test an unset secret is a random one per process: sign-ins end when the process restarts.
    """
    configured = settings.session_secret.get_secret_value()
    if configured:
        return configured
    return secrets.token_urlsafe(32) if settings.env in (Environment.dev, Environment.test) else None


def csrf_token(request: Request) -> str:
    """The session's CSRF token, made on first use."""
    token = request.session.get(CSRF_KEY)
    if not isinstance(token, str) or not token:
        token = secrets.token_urlsafe(32)
        request.session[CSRF_KEY] = token
    return token


def token_key(key: str, digest: str) -> str:
    """Which token a session belongs to, as stored: HMAC-SHA256 under the server's session ``key`` of the token's
    SHA-256 hex ``digest`` (a stolen row or cookie offers nothing to guess a weak token against offline)."""
    return hmac.new(key.encode(), b"specwatch dashboard token\0" + digest.encode(), hashlib.sha256).hexdigest()


def _id_digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def _scope_of(key: str, settings: Settings, stored: str) -> Scope | None:
    """The scope of the configured token whose keyed id is ``stored``; every candidate compared in constant time."""
    found: Scope | None = None
    for scope, digests in ((Scope.read, settings.api_read_token_hashes), (Scope.write, settings.api_token_hashes)):
        for digest in digests:
            if hmac.compare_digest(token_key(key, digest), stored):
                found = scope
    return found


def session_scope_of(db: Session, session_id: str, key: str, settings: Settings, now: datetime) -> Scope | None:
    """The scope of the live session ``session_id``, or ``None``: unknown, expired, revoked, or its token no longer
    configured (then the row is revoked, for good). Flushes, never commits."""
    row = db.scalars(select(DashboardSession).where(DashboardSession.id_digest == _id_digest(session_id))).first()
    if row is None or row.revoked_at is not None or row.expires_at <= now:
        return None
    scope = _scope_of(key, settings, row.token_key)
    if scope is None:
        row.revoked_at, row.revoked_reason = now, TOKEN_REVOKED
        db.flush()
    return scope


def viewer(request: Request, settings: Settings) -> Viewer:
    """The request's viewer, looked up once per request in a unit of work of its own (it may revoke the
    session of a token that is no longer configured, whatever the request then does)."""
    cached = getattr(request.state, "viewer", None)
    if isinstance(cached, Viewer):
        return cached
    session_id = request.session.get(SESSION_ID_KEY)
    scope = None
    if isinstance(session_id, str) and session_id and request.app.state.sign_in_enabled:
        with session_scope(app_session_factory(request)) as db:
            scope = session_scope_of(db, session_id, request.app.state.session_key, settings, datetime.now(UTC))
    # Only a signed-in page carries forms that need the token (the login page asks for it itself): an
    # anonymous reader gets no cookie.
    found = request.state.viewer = Viewer(scope=scope, csrf=csrf_token(request) if scope is not None else "")
    return found


def sign_in(request: Request, db: Session, digest: str, now: datetime) -> None:
    """Start a signed-in session for the token whose SHA-256 is ``digest``: a new row, a fresh session id and
    CSRF token in the cookie (nothing from before the sign-in survives). Flushes, never commits."""
    ended = now - KEEP_ENDED
    db.execute(delete(DashboardSession).where(or_(DashboardSession.expires_at < ended, DashboardSession.revoked_at < ended)))
    session_id = secrets.token_urlsafe(32)
    key = request.app.state.session_key
    row = DashboardSession(
        id_digest=_id_digest(session_id),
        token_key=token_key(key, digest),
        created_at=now,
        expires_at=now + timedelta(seconds=SESSION_MAX_AGE_S),
    )
    db.add(row)
    db.flush()
    request.session.clear()
    request.session[SESSION_ID_KEY] = session_id
    request.session[CSRF_KEY] = secrets.token_urlsafe(32)
    request.state.viewer = None


def sign_out(request: Request, db: Session, now: datetime) -> None:
    """End the session on the server (its row revoked: a copy of the cookie is worthless) and clear the cookie."""
    session_id = request.session.get(SESSION_ID_KEY)
    if isinstance(session_id, str) and session_id:
        row = db.scalars(select(DashboardSession).where(DashboardSession.id_digest == _id_digest(session_id))).first()
        if row is not None and row.revoked_at is None:
            row.revoked_at, row.revoked_reason = now, SIGNED_OUT
            db.flush()
    request.session.clear()
    request.state.viewer = None


class FormError(Exception):
    """A dashboard form was refused: its status and a sentence for the person who sent it."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


def check_csrf(request: Request, sent: str) -> None:
    expected = request.session.get(CSRF_KEY)
    if not isinstance(expected, str) or not expected or not hmac.compare_digest(expected.encode(), sent.encode()):
        raise FormError(
            status.HTTP_403_FORBIDDEN,
            "This form's security token (CSRF) does not match your session, which may have expired or been signed "
            "out. Reload the page and try again.",
        )


def require_writer(request: Request, settings: Settings, sent_csrf: str) -> None:
    """A form that changes something: a signed-in session (401), the session's CSRF token (403), a write token (403)."""
    scope = viewer(request, settings).scope
    if scope is None:
        raise FormError(status.HTTP_401_UNAUTHORIZED, "Sign in with a write token to acknowledge or resolve alerts.")
    check_csrf(request, sent_csrf)
    if scope is not Scope.write:
        raise FormError(status.HTTP_403_FORBIDDEN, "You are signed in with a read-only token: sign in with a write token.")


def safe_next(target: str | None) -> str:
    """Where to go after a form: a dashboard path only (never another site)."""
    if target and target.startswith("/ui") and not target.startswith("//") and "\\" not in target:
        return target
    return "/ui"


def require_dashboard_read(request: Request, settings: SettingsDep, credentials: BearerCredentials) -> None:
    """The dashboard's reads: open unless ``api_auth_reads``; then a signed-in session or a bearer token.

    A browser with neither is sent to the login page (303), a client that sent a bad token gets the API's 401.
    """
    if not settings.api_auth_reads or viewer(request, settings).signed_in:
        return
    if credentials is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise HTTPException(status.HTTP_303_SEE_OTHER, "sign in first", headers={"Location": f"/ui/login?next={quote(target, safe='')}"})
    require_read(settings, credentials)


DashboardRead = Depends(require_dashboard_read)
