"""GitHub webhooks: ``POST /webhooks/github`` turns a push into recorded commits and queued runs.

In order, for every request (docs/architecture.md §5, "The delivery"):

1. and 2. (:mod:`~service.webhooks.body`) a request without a well-formed ``X-Hub-Signature-256`` (or with no
   secret configured) is refused (401) and one that declares a body over the limit (413), before its body is
   read; the body is then read within the limit and a bounded number of concurrent bodies (413, 503) while
   its HMAC-SHA256 is computed, and the signature compared in constant time before anything is parsed (401);
3. (:mod:`~service.webhooks.payload`) the body is parsed (400 for bad JSON or a payload that is not shaped
   as GitHub sends it);
4. (:mod:`~service.webhooks.deliveries`) the delivery (``X-GitHub-Delivery``, unique) is recorded with what
   it led to, and for a push to a watched branch of a registered target: its commits and the runs the
   target's commit policy asks for, all in the request's one transaction; a redelivery changes nothing;
5. (here) once that transaction has committed (:func:`service.after_commit.after_commit`), the runs are
   enqueued by id (:func:`service.queue.enqueue_runs`, a background task run after the response): ``ping``
   → 200, everything else → 202 with what happened and why.

Nothing is stored for a rejected request (401, 400, 413): the request's transaction rolls back.
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from fastapi import APIRouter, BackgroundTasks, Depends, HTTPException, Request, Response, status
from pydantic import BaseModel

from service.after_commit import after_commit
from service.db import session_scope
from service.deps import ProducerDep, SessionFactoryDep, SettingsDep
from service.ingest import RunOptions
from service.logsafe import loggable
from service.queue import enqueue_runs
from service.webhooks.body import (
    DELIVERY_HEADER,
    DELIVERY_ID_MAX,
    EVENT_HEADER,
    EVENT_MAX,
    SIGNATURE_HEADER,
    BodyBudget,
    SignatureError,
    signature,
    verified_body,
    verify_signature,
)
from service.webhooks.deliveries import Ingested, Outcome, ingest, ingest_push
from service.webhooks.payload import PayloadError, PushEvent, parse_payload, parse_push

__all__ = [
    "SIGNATURE_HEADER",
    "BodyBudget",
    "Ingested",
    "Outcome",
    "PayloadError",
    "PushEvent",
    "RunOptions",
    "SignatureError",
    "WebhookAnswer",
    "github_webhook",
    "ingest",
    "ingest_push",
    "parse_payload",
    "parse_push",
    "router",
    "signature",
    "verify_signature",
]

log = logging.getLogger(__name__)

router = APIRouter(tags=["webhooks"])


class WebhookAnswer(BaseModel):
    delivery: str
    event: str
    outcome: Literal["accepted", "ignored", "duplicate"]
    reason: str | None
    commits: int
    runs: list[int]


def _required_header(request: Request, name: str, limit: int) -> str:
    value = request.headers.get(name, "").strip()
    if not value or len(value) > limit:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"missing or invalid {name} header")
    return value


@router.post(
    "/webhooks/github",
    status_code=status.HTTP_202_ACCEPTED,
    responses={
        200: {"description": "ping"},
        400: {"description": "malformed payload or headers"},
        401: {"description": "bad or missing signature"},
        413: {"description": "body over the size limit"},
        503: {"description": "too many bodies being read, or the database is unavailable"},
    },
)
def github_webhook(
    *,
    request: Request,
    response: Response,
    body: Annotated[bytes, Depends(verified_body)],
    sessions: SessionFactoryDep,
    settings: SettingsDep,
    producer: ProducerDep,
    background: BackgroundTasks,
) -> WebhookAnswer:
    """Receive a GitHub webhook (``body`` is verified): see the module docstring for the order of checks."""
    event = _required_header(request, EVENT_HEADER, EVENT_MAX)
    delivery_id = _required_header(request, DELIVERY_HEADER, DELIVERY_ID_MAX)
    try:
        payload = parse_payload(body, request.headers.get("content-type"))
        options = RunOptions.from_settings(settings)
        # The unit of work commits here, in the thread that took the target's row lock: a commit left to
        # a dependency's teardown needs another worker thread, and under load every thread can be
        # waiting for that same lock (a convoy that never drains).
        with session_scope(sessions) as session:
            result = ingest(session, delivery_id=delivery_id, event=event, payload=payload, options=options)
            if result.run_ids:
                # Once committed, the runs are enqueued in a background task after the response.
                after_commit(session, background.add_task, enqueue_runs, producer, result.run_ids)
    except PayloadError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from None
    log.info(
        "webhook delivery=%s event=%s outcome=%s commits=%s runs=%s reason=%s",
        loggable(delivery_id),
        loggable(event),
        result.outcome.value,
        result.commits,
        result.run_ids,
        loggable(result.reason, 500),
    )
    if event == "ping":
        response.status_code = status.HTTP_200_OK
    return WebhookAnswer(
        delivery=delivery_id,
        event=event,
        outcome=result.outcome.value,
        reason=result.reason,
        commits=result.commits,
        runs=result.run_ids,
    )
