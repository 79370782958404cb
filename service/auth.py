"""API bearer tokens: reads optionally, writes always.

Tokens are never stored: settings hold their SHA-256 hex digests (``SPECWATCH_API_TOKEN_HASHES`` for write
tokens, ``SPECWATCH_API_READ_TOKEN_HASHES`` for read-only ones). A presented token is hashed and compared
with every stored digest in constant time (:func:`hmac.compare_digest`, and no early exit), so neither the
answer's timing nor its content tells which digest came close.

- no token, or an unknown one: 401 with ``WWW-Authenticate: Bearer``;
- a read-only token on a write: 403;
- reads need a token only when ``SPECWATCH_API_AUTH_READS`` is on;
- ``/metrics`` follows the reads unless ``SPECWATCH_METRICS_PUBLIC`` says otherwise.
"""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum
from typing import Annotated

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.deps import SettingsDep
from service.settings import Settings


class Scope(StrEnum):
    read = "read"
    write = "write"


_bearer = HTTPBearer(auto_error=False, description="an API token (its SHA-256 digest is in SPECWATCH_API_TOKEN_HASHES)")


def hash_token(token: str) -> str:
    """The SHA-256 hex digest of ``token``: what the settings store."""
    return hashlib.sha256(token.encode()).hexdigest()


def _matches(digest: str, stored: list[str]) -> bool:
    found = False
    for candidate in stored:
        # Every digest is compared (no short cut), each in constant time.
        found |= hmac.compare_digest(digest, candidate)
    return found


def token_scope(settings: Settings, token: str | None) -> Scope | None:
    """The scope ``token`` grants, or ``None`` for a missing or unknown token."""
    if not token:
        return None
    return digest_scope(settings, hash_token(token))


def digest_scope(settings: Settings, digest: str) -> Scope | None:
    """The scope of the token whose SHA-256 hex digest is ``digest`` (what a dashboard session holds)."""
    if _matches(digest, settings.api_token_hashes):
        return Scope.write
    if _matches(digest, settings.api_read_token_hashes):
        return Scope.read
    return None


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, message, headers={"WWW-Authenticate": "Bearer"})


#: The request's ``Authorization: Bearer`` credentials, if any.
BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def require_read(settings: SettingsDep, credentials: BearerCredentials) -> None:
    """Reads: open unless ``api_auth_reads``; then any valid token (read or write)."""
    if not settings.api_auth_reads:
        return
    if credentials is None:
        raise _unauthorized("a bearer token is required")
    if token_scope(settings, credentials.credentials) is None:
        raise _unauthorized("invalid token")


def require_metrics(settings: SettingsDep, credentials: BearerCredentials) -> None:
    """``/metrics``: open when :attr:`Settings.metrics_anonymous`; else any valid token (read or write)."""
    if settings.metrics_anonymous:
        return
    if credentials is None:
        raise _unauthorized("a bearer token is required")
    if token_scope(settings, credentials.credentials) is None:
        raise _unauthorized("invalid token")


def require_write(settings: SettingsDep, credentials: BearerCredentials) -> None:
    """Writes: always a write token (401 without a valid token, 403 with a read-only one)."""
    if credentials is None:
        raise _unauthorized("a bearer token is required")
    scope = token_scope(settings, credentials.credentials)
    if scope is None:
        raise _unauthorized("invalid token")
    if scope is not Scope.write:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this token may only read")


ReadAuth = Depends(require_read)
MetricsAuth = Depends(require_metrics)
WriteAuth = Depends(require_write)
