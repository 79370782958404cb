"""GitHub webhooks: ``POST /webhooks/github`` turns a push into recorded commits and queued runs.

In order, for every request (docs/architecture.md §5, "The delivery"):

1. a request without a well-formed ``X-Hub-Signature-256`` (or with no secret configured) is refused (401)
   before its body is read; one that declares a body over the limit is refused (413) likewise;
2. the raw body is streamed through an HMAC-SHA256 with the webhook secret into a spool that holds a small
   body in memory and a larger one on disk (413 as soon as it exceeds the limit); the signature is compared
   in constant time before anything is parsed (401). At most ``webhook_max_concurrent_bodies`` bodies are
   read at once per process; past that, 503 with ``Retry-After`` at once (no queue of open connections).
   So the memory an unauthenticated client can hold is bounded by slots × spool threshold, not by the body
   limit (issue 14: 8 concurrent unsigned 24 MB bodies took the process from 129 MB to 510 MB);
3. the body is parsed (400 for bad JSON or a payload that is not shaped as GitHub sends it);
4. the delivery (``X-GitHub-Delivery``, unique) is recorded with what it led to, and for a push to a
   watched branch of a registered target: its commits and the runs the target's commit policy asks for,
   all in the request's one transaction; a redelivery changes nothing;
5. after the commit, the runs are enqueued by id (:func:`service.queue.enqueue_runs`, a background task run
   after the response): ``ping`` → 200, everything else → 202 with what happened and why.

Nothing is stored for a rejected request (401, 400, 413): the request's transaction rolls back.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs

from fastapi import APIRouter, BackgroundTasks, Depends, HTTPException, Request, Response, status
from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db import insert_ignoring_conflicts, session_scope
from service.deps import ProducerDep, SessionFactoryDep, SettingsDep, app_settings
from service.ingest import NewCommit, Recorded, RunOptions, lock_targets, record_and_queue
from service.logsafe import loggable
from service.models import Delivery, DeliveryStatus, InstallMode, Target
from service.queue import enqueue_runs
from service.targets import is_ref_name, repo_key

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Hub-Signature-256"
EVENT_HEADER = "X-GitHub-Event"
DELIVERY_HEADER = "X-GitHub-Delivery"
BRANCH_PREFIX = "refs/heads/"
TAG_PREFIX = "refs/tags/"
ZERO_SHA = frozenset({"0" * 40, "0" * 64})
AUTHOR_MAX, DELIVERY_ID_MAX, EVENT_MAX = 255, 100, 50
# The deepest JSON nesting accepted: GitHub's payloads nest a few levels; deeper is refused (400) before
# Python's recursion limit can turn it into a 500.
JSON_DEPTH_MAX = 64

router = APIRouter(tags=["webhooks"])


# --- 1 and 2. the body, within the limit, and its signature ------------------------------------------------

_SIGNATURE_FORMAT = re.compile(r"sha256=[0-9a-fA-F]{64}")
BUSY_RETRY_AFTER_S = 5


class BodySlots:
    """How many webhook bodies this process is reading now, at most ``limit`` (one event loop: no lock)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.busy = limit, 0

    def take(self) -> bool:
        if self.busy >= self.limit:
            return False
        self.busy += 1
        return True

    def give_back(self) -> None:
        self.busy -= 1


def body_slots(request: Request) -> BodySlots:
    """The application's :class:`BodySlots`, made on first use from its settings."""
    state = request.app.state
    slots: BodySlots | None = getattr(state, "webhook_body_slots", None)
    if slots is None:
        slots = state.webhook_body_slots = BodySlots(app_settings(request).webhook_max_concurrent_bodies)
    return slots


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
    slots = body_slots(request)
    if not slots.take():
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"{slots.limit} webhook bodies are being read; retry later",
            headers={"Retry-After": str(BUSY_RETRY_AFTER_S)},
        )
    try:
        mac = hmac.new(secret.encode(), digestmod=hashlib.sha256)
        with tempfile.SpooledTemporaryFile(max_size=settings.webhook_spool_bytes) as spool:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"body exceeds the {limit}-byte limit")
                mac.update(chunk)
                spool.write(chunk)
            if not hmac.compare_digest(header.lower().encode(), ("sha256=" + mac.hexdigest()).encode()):
                raise _unauthorized(f"{SIGNATURE_HEADER} does not match the body", request)
            spool.seek(0)
            return spool.read()
    finally:
        slots.give_back()


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


# --- 3. the payload ------------------------------------------------------------------------------------

Sha = Annotated[str, StringConstraints(pattern=r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")]


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class PushAuthor(_Payload):
    name: str | None = None
    email: str | None = None
    username: str | None = None


class PushCommit(_Payload):
    id: Sha
    message: str | None = None
    timestamp: datetime | None = None
    author: PushAuthor | None = None
    distinct: bool = True


class PushRepository(_Payload):
    full_name: str | None = None
    clone_url: str | None = None
    html_url: str | None = None
    ssh_url: str | None = None
    git_url: str | None = None
    url: str | None = None


def _git_ref(ref: str) -> str:
    if not is_ref_name(ref):
        raise ValueError("not a valid git ref name")
    return ref


class PushEvent(_Payload):
    """The fields of GitHub's ``push`` payload that specwatch uses."""

    ref: Annotated[str, StringConstraints(min_length=1, max_length=255), AfterValidator(_git_ref)]
    before: Sha
    after: Sha
    created: bool = False
    deleted: bool = False
    forced: bool = False
    commits: list[PushCommit] = []
    head_commit: PushCommit | None = None
    repository: PushRepository

    def repo_keys(self) -> set[str]:
        """Every normal form (:func:`service.targets.repo_key`) under which this repository may be registered."""
        repo = self.repository
        urls = [repo.clone_url, repo.html_url, repo.ssh_url, repo.git_url, repo.url]
        if repo.full_name:
            host = (repo_key(repo.html_url or "") or "github.com/").split("/", 1)[0] or "github.com"
            urls.append(f"https://{host}/{repo.full_name}")
        return {key for url in urls if url and (key := repo_key(url)) is not None}

    def pushed_commits(self) -> list[PushCommit]:
        """The commits the push brought, oldest first, ending with the new head (when it is known)."""
        commits = list(self.commits)
        seen = {c.id for c in commits}
        if self.head_commit is not None and self.head_commit.id not in seen:
            commits.append(self.head_commit)
        elif self.head_commit is None and self.after not in seen and self.after not in ZERO_SHA:
            commits.append(PushCommit(id=self.after))
        return commits


class PayloadError(ValueError):
    """The body is not a payload as GitHub sends it."""


def parse_payload(body: bytes, content_type: str | None) -> dict[str, Any]:
    """The JSON object in ``body`` (``application/json``, or ``payload=`` in a form-encoded body)."""
    try:
        text = body.decode()
        if (content_type or "").split(";")[0].strip().lower() == "application/x-www-form-urlencoded":
            text = parse_qs(text, strict_parsing=True).get("payload", [""])[0]
        payload = json.loads(text)
    except RecursionError:
        raise PayloadError(f"body nests JSON deeper than {JSON_DEPTH_MAX} levels") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise PayloadError(f"body is not valid JSON: {loggable(exc)}") from exc
    if not isinstance(payload, dict):
        raise PayloadError("body is not a JSON object")
    return {_storable(key): _storable(value) for key, value in payload.items()}


def _storable(value: Any, depth: int = 1) -> Any:
    """``value`` with every string made storable as PostgreSQL text: valid JSON may hold NUL (``\\u0000``) and
    lone surrogates (``\\ud800``), which PostgreSQL refuses: they become U+FFFD (no push is lost to them).
    :class:`PayloadError` past :data:`JSON_DEPTH_MAX` levels of nesting."""
    if depth > JSON_DEPTH_MAX:
        raise PayloadError(f"body nests JSON deeper than {JSON_DEPTH_MAX} levels")
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            value = value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [_storable(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {_storable(key): _storable(item, depth + 1) for key, item in value.items()}
    return value


def parse_push(payload: dict[str, Any]) -> PushEvent:
    try:
        return PushEvent.model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_input=False)[:3])
        raise PayloadError(f"not a GitHub push payload: {problems}") from exc


# --- 4. recording ----------------------------------------------------------------------------------------


class Outcome(StrEnum):
    accepted = "accepted"
    ignored = "ignored"
    duplicate = "duplicate"


@dataclass
class Ingested:
    """What a delivery led to: the runs to enqueue once the transaction has committed."""

    outcome: Outcome
    reason: str | None = None
    commits: int = 0
    run_ids: list[int] = field(default_factory=list)


def ingest(session: Session, *, delivery_id: str, event: str, payload: dict[str, Any], options: RunOptions) -> Ingested:
    """Record one verified delivery and what it leads to (flushed, not committed); a redelivery is a no-op.

    Raises :class:`PayloadError` (before anything is added) when a ``push`` payload is malformed.
    """
    push = parse_push(payload) if event == "push" else None
    if session.scalar(select(Delivery.id).where(Delivery.github_delivery_id == delivery_id)) is not None:
        return Ingested(Outcome.duplicate, f"delivery {delivery_id} was already processed")
    values: dict[str, Any] = {"github_delivery_id": delivery_id, "event": event, "status": DeliveryStatus.ignored}
    if push is not None:
        values.update(ref=push.ref, before_sha=push.before, after_sha=push.after, forced=push.forced)
    delivery = _insert_delivery(session, values)
    if delivery is None:
        return Ingested(Outcome.duplicate, f"delivery {delivery_id} was already processed")

    if event == "ping":
        result = Ingested(Outcome.ignored, f"ping (zen: {payload.get('zen', '')!s})")
    elif push is None:
        result = Ingested(Outcome.ignored, f"event {event!r} is not handled")
    else:
        result = ingest_push(session, push, options)
    delivery.status = DeliveryStatus.accepted if result.outcome is Outcome.accepted else DeliveryStatus.ignored
    delivery.reason = result.reason
    session.flush()
    return result


def _insert_delivery(session: Session, values: dict[str, Any]) -> Delivery | None:
    """Insert the delivery unless its id is taken (then ``None``): ``INSERT .. ON CONFLICT DO NOTHING``.

    A concurrent request with the same id waits for the other's transaction and then inserts nothing. This
    avoids a savepoint, which on SQLite (pysqlite) would commit the outer transaction when released.
    """
    statement = insert_ignoring_conflicts(session, Delivery, values, [Delivery.github_delivery_id])
    if statement is None:
        delivery = Delivery(**values)
        session.add(delivery)
        session.flush()
        return delivery
    delivery_id = session.scalar(statement.returning(Delivery.id))
    return None if delivery_id is None else session.get_one(Delivery, delivery_id)


def ingest_push(session: Session, push: PushEvent, options: RunOptions) -> Ingested:
    """Record a push's commits for every source-installed target that watches its repository and branch,
    and queue runs for those the targets' commit policies select."""
    if push.ref.startswith(TAG_PREFIX):
        return Ingested(Outcome.ignored, f"tag push {push.ref}: tags are not tested from pushes")
    if not push.ref.startswith(BRANCH_PREFIX):
        return Ingested(Outcome.ignored, f"ref {push.ref} is not a branch")
    branch = push.ref.removeprefix(BRANCH_PREFIX)
    if push.deleted or push.after in ZERO_SHA:
        return Ingested(Outcome.ignored, f"branch {branch} was deleted")

    keys = push.repo_keys()
    matching = [t.id for t in session.scalars(select(Target)) if repo_key(t.repo_url) in keys]
    repository = push.repository.full_name or push.repository.clone_url or "?"
    if not matching:
        return Ingested(Outcome.ignored, f"repository {repository} is not a registered target")
    # Serialise pushes (and pollers) per target, so branch order is assigned once per commit.
    targets = lock_targets(session, matching)
    watching = [t for t in targets if branch in t.branches]
    if not watching:
        return Ingested(Outcome.ignored, f"branch {branch} of {repository} is not watched by {', '.join(t.name for t in targets)}")

    result = Ingested(Outcome.ignored)
    notes: list[str] = []
    for target in watching:
        if target.install_mode is not InstallMode.source:
            notes.append(f"{target.name}: installs releases ({target.install_mode.value}), pushes are not tested")
            continue
        recorded = _record_push(session, target, branch, push, options)
        result.commits += recorded.new_commits
        result.run_ids += recorded.run_ids
        notes.append(f"{target.name}: {recorded.new_commits} new commit(s), {len(recorded.run_ids)} run(s) queued")
    forced = "forced push, " if push.forced else ""
    result.reason = f"{forced}{branch} {push.before[:12]}..{push.after[:12]}: " + "; ".join(notes)
    if result.commits or result.run_ids:
        result.outcome = Outcome.accepted
    return result


def _record_push(session: Session, target: Target, branch: str, push: PushEvent, options: RunOptions) -> Recorded:
    """Add the push's unknown commits to ``target`` (in branch order) and runs per its policy."""
    return record_and_queue(session, target, branch, [_described(c) for c in push.pushed_commits()], head=push.after, options=options)


def _described(pushed: PushCommit) -> NewCommit:
    """A commit as a push describes it. GitHub's push payload carries no parents; they stay unknown ([])."""
    author = None
    if pushed.author is not None and (pushed.author.name or pushed.author.email):
        author = " ".join(filter(None, [pushed.author.name, f"<{pushed.author.email}>" if pushed.author.email else None]))
        author = author[:AUTHOR_MAX]
    return NewCommit(sha=pushed.id, author=author, committed_at=pushed.timestamp, message=pushed.message)


# --- 5. the route ------------------------------------------------------------------------------------------


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
    if result.run_ids:
        # Runs after the response, so after the transaction above committed.
        background.add_task(enqueue_runs, producer, result.run_ids)
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
