"""Steps 1 and 2 of a webhook request: its body within the size limit, and its signature, before anything is parsed.

A request without a well-formed ``X-Hub-Signature-256`` (or with no secret configured) is refused (401) before
its body is read; one that declares a body over the limit is refused (413) likewise. The raw body is streamed
through an HMAC-SHA256 with the webhook secret into a spool that holds a small body in memory and a larger one
on disk (413 as soon as it exceeds the limit); the signature is compared in constant time (401).

The bodies being read at once share a byte budget, ``webhook_body_budget_bytes`` per process: each chunk is
charged to it as it arrives and the whole body is given back when the request is done; a body whose declared
length, or whose next chunk, does not fit gets 503 with ``Retry-After`` at once (no queue of open connections).
So what unauthenticated clients can hold (memory and spool disk) is bounded by the budget (issue 14: 8
concurrent unsigned 24 MB bodies took the process from 129 MB to 510 MB), and a connection that drips a body
holds only the bytes it has sent: 16 such connections hold a few hundred bytes, and a real push, which fits
the budget on its own (it is at least ``webhook_max_body_bytes``), still gets through (issue 42; before, 8
slots counted connections, and 16 dripping ones kept real pushes at 503). The time a body may take is bounded
too: the whole body within ``webhook_body_deadline_s``, no read waiting longer than
``webhook_body_read_timeout_s``, else 408 (issue 28).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import tempfile
from collections.abc import AsyncGenerator
from contextlib import aclosing

from fastapi import HTTPException, Request, status

from service.deps import app_settings
from service.logsafe import loggable

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Hub-Signature-256"
EVENT_HEADER = "X-GitHub-Event"
DELIVERY_HEADER = "X-GitHub-Delivery"
DELIVERY_ID_MAX, EVENT_MAX = 100, 50


_SIGNATURE_FORMAT = re.compile(r"sha256=[0-9a-fA-F]{64}")
BUSY_RETRY_AFTER_S = 5


class BodyBudget:
    """The bytes of webhook bodies this process holds now, at most ``limit`` (one event loop: no lock)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0

    def fits(self, size: int) -> bool:
        return self.held + size <= self.limit

    def take(self, size: int) -> bool:
        """Charge ``size`` bytes if they fit; whether they did."""
        if not self.fits(size):
            return False
        self.held += size
        return True

    def give_back(self, size: int) -> None:
        self.held -= size


def body_budget(request: Request) -> BodyBudget:
    """The application's :class:`BodyBudget`, made on first use from its settings."""
    state = request.app.state
    budget: BodyBudget | None = getattr(state, "webhook_body_budget", None)
    if budget is None:
        budget = state.webhook_body_budget = BodyBudget(app_settings(request).webhook_body_budget_bytes)
    return budget


def _busy(budget: BodyBudget) -> HTTPException:
    log.warning("webhook_rejected reason=budget held=%d limit=%d", budget.held, budget.limit)
    return HTTPException(
        status.HTTP_503_SERVICE_UNAVAILABLE,
        f"{budget.held} of {budget.limit} bytes of webhook bodies are being read; retry later",
        headers={"Retry-After": str(BUSY_RETRY_AFTER_S), "Connection": "close"},
    )


async def _timely_chunks(request: Request, deadline_s: float, read_timeout_s: float) -> AsyncGenerator[bytes, None]:
    """The chunks of ``request``'s body, all of them within ``deadline_s`` and each within ``read_timeout_s`` of
    the one before; past either, 408 (``Connection: close``: the rest of the body is never read)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    chunks = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(anext(chunks), max(0.0, min(read_timeout_s, end - loop.time())))
        except StopAsyncIteration:
            return
        except TimeoutError:
            log.warning(
                "webhook_rejected reason=slow_body deadline_s=%s read_timeout_s=%s delivery=%s",
                deadline_s,
                read_timeout_s,
                loggable(request.headers.get(DELIVERY_HEADER), DELIVERY_ID_MAX),
            )
            raise HTTPException(
                status.HTTP_408_REQUEST_TIMEOUT,
                f"the body was not received within {deadline_s:g} s (or a read waited over {read_timeout_s:g} s)",
                headers={"Connection": "close"},
            ) from None
        yield chunk


def _unauthorized(reason: str, request: Request) -> HTTPException:
    log.warning("webhook_rejected reason=%s delivery=%s", reason, loggable(request.headers.get(DELIVERY_HEADER), DELIVERY_ID_MAX))
    return HTTPException(status.HTTP_401_UNAUTHORIZED, reason)


async def verified_body(request: Request) -> bytes:
    """The raw body of a request signed with the webhook secret; see the module docstring (steps 1 and 2)."""
    settings = app_settings(request)
    secret = settings.webhook_secret.get_secret_value()
    header = request.headers.get(SIGNATURE_HEADER, "").strip()
    if not secret:
        raise _unauthorized("webhooks are refused: SPECWATCH_WEBHOOK_SECRET is not set", request)
    if not header:
        raise _unauthorized(f"missing {SIGNATURE_HEADER}", request)
    if not _SIGNATURE_FORMAT.fullmatch(header):
        raise _unauthorized(f"{SIGNATURE_HEADER} is not sha256=<64 hex digits>", request)
    limit = settings.webhook_max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise HTTPException(status.HTTP_400_BAD_REQUEST, "invalid Content-Length")
        if int(declared) > limit:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"body of {declared} bytes exceeds the {limit}-byte limit")
    budget = body_budget(request)
    if declared is not None and not budget.fits(int(declared)):
        raise _busy(budget)
    size = 0
    try:
        mac = hmac.new(secret.encode(), digestmod=hashlib.sha256)
        with tempfile.SpooledTemporaryFile(max_size=settings.webhook_spool_bytes) as spool:
            chunks = _timely_chunks(request, settings.webhook_body_deadline_s, settings.webhook_body_read_timeout_s)
            async with aclosing(chunks):
                async for chunk in chunks:
                    if size + len(chunk) > limit:
                        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"body exceeds the {limit}-byte limit")
                    if not budget.take(len(chunk)):
                        raise _busy(budget)
                    size += len(chunk)
                    mac.update(chunk)
                    spool.write(chunk)
            if not hmac.compare_digest(header.lower().encode(), ("sha256=" + mac.hexdigest()).encode()):
                raise _unauthorized(f"{SIGNATURE_HEADER} does not match the body", request)
            spool.seek(0)
            return spool.read()
    finally:
        budget.give_back(size)


# --- the signature, for callers with a body in hand -------------------------------------------------------


class SignatureError(Exception):
    """The request is not signed with our webhook secret."""


def signature(secret: str, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value GitHub sends for ``body``: ``sha256=<hex HMAC-SHA256>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify_signature(secret: str, body: bytes, header: str | None) -> None:
    """Raise :class:`SignatureError` unless ``header`` is the HMAC-SHA256 of ``body`` (constant-time compare)."""
    if not secret:
        raise SignatureError("webhooks are refused: SPECWATCH_WEBHOOK_SECRET is not set")
    if not header:
        raise SignatureError(f"missing {SIGNATURE_HEADER}")
    if not hmac.compare_digest(header.strip().encode(), signature(secret, body).encode()):
        raise SignatureError(f"{SIGNATURE_HEADER} does not match the body")
