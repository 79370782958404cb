"""Who is looking at the dashboard: a signed session cookie holding the digest of an API token, and CSRF tokens.

Signing in means presenting an API token once (the login form). The session then holds the token's SHA-256
digest, never the token, in a cookie signed by Starlette's ``SessionMiddleware`` (itsdangerous, key
``SPECWATCH_SESSION_SECRET``), ``HttpOnly``, ``SameSite=Strict``, scoped to ``/ui``, ``Secure`` when the
dashboard is served over HTTPS, and expiring after :data:`SESSION_MAX_AGE_S`. Every request re-checks the
digest against the configured token digests (:func:`service.auth.digest_scope`), so a revoked token ends
its sessions at once.

Every form that changes something carries the session's CSRF token (synchronizer token pattern): a random
value kept in the session and echoed in a hidden field, compared in constant time. A form from another
site cannot know it; ``SameSite=Strict`` would keep the cookie off such a request anyway.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import quote

from fastapi import Depends, HTTPException, Request, status

from service.auth import BearerCredentials, Scope, digest_scope, require_read
from service.deps import SettingsDep
from service.settings import Environment, Settings

SESSION_COOKIE = "specwatch_session"
SESSION_MAX_AGE_S = 8 * 60 * 60
CSRF_KEY, DIGEST_KEY = "csrf", "token_sha256"


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


def viewer(request: Request, settings: Settings) -> Viewer:
    digest = request.session.get(DIGEST_KEY)
    scope = digest_scope(settings, digest) if isinstance(digest, str) else None
    # Only a signed-in page carries forms that need the token (the login page asks for it itself): an
    # anonymous reader gets no cookie.
    return Viewer(scope=scope, csrf=csrf_token(request) if scope is not None else "")


def sign_in(request: Request, digest: str) -> None:
    """Start a signed-in session: a fresh CSRF token with it (no token from before the sign-in survives)."""
    request.session.clear()
    request.session[DIGEST_KEY] = digest
    request.session[CSRF_KEY] = secrets.token_urlsafe(32)


def sign_out(request: Request) -> None:
    request.session.clear()


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
