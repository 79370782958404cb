"""Property-based fuzzing of ``POST /webhooks/github`` on real PostgreSQL: bad input is refused, never a 500.

Random bodies, headers and signatures; valid signatures over garbage, over JSON of the wrong shape (fields
missing, of the wrong type, nested nulls), over unicode (NUL, lone surrogates, astral planes) and over bodies
around the size limit. Properties: the answer is never a 5xx; a request without a valid signature stores
nothing; a refused request (4xx) stores nothing. The database is this module's own (real commits), with a
registered target, so that well-formed pushes do store commits and runs.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.db import make_engine, session_scope
from service.models import Commit, CommitPolicy, Delivery, Run
from service.settings import Settings
from service.targets import add_target, make_spec
from service.webhooks import signature
from tests.support.pushes import REPO_URL, push_payload, sha, signed

pytestmark = pytest.mark.integration

SECRET = "fuzz-webhook-secret"
LIMIT = 64 * 1024
ALLOWED = {200, 202, 400, 401, 413}
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@dataclass
class Recording:
    sent: list[int] = field(default_factory=list)

    def send_run(self, run_id: int) -> None:
        self.sent.append(run_id)


@dataclass
class Webhook:
    client: TestClient
    factory: sessionmaker[Session]

    def stored(self) -> tuple[int, ...]:
        with session_scope(self.factory) as session:
            return tuple(session.scalar(select(func.count()).select_from(model)) or 0 for model in (Delivery, Commit, Run))

    def post(self, body: bytes, headers: dict[str, str] | list[tuple[bytes, bytes]]) -> tuple[int, bool]:
        """The status and whether anything was stored."""
        before = self.stored()
        answer = self.client.post("/webhooks/github", content=body, headers=headers)
        assert answer.status_code in ALLOWED, (answer.status_code, answer.text[:500])
        return answer.status_code, self.stored() != before


@pytest.fixture(scope="module")
def webhook(create_migrated_postgres_database: Callable[[], str]) -> Iterator[Webhook]:
    engine = make_engine(create_migrated_postgres_database())
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    with session_scope(factory) as session:
        add_target(
            session, make_spec(name="fuzzed", repo_url=REPO_URL, branches=["main"], adapter="toy:f", commit_policy=CommitPolicy.every)
        )
    app_settings = Settings(
        env="test",
        database_url="postgresql+psycopg://unused",
        redis_url="redis://127.0.0.1:1/0",
        webhook_secret=SecretStr(SECRET),
        webhook_max_body_bytes=LIMIT,
    )
    try:
        with TestClient(create_app(app_settings, session_factory=factory, producer=Recording()), raise_server_exceptions=False) as client:
            yield Webhook(client, factory)
    finally:
        engine.dispose()


# --- strategies ------------------------------------------------------------------------------------------

# Header values as raw bytes (latin-1 on the ASGI side), without the characters HTTP forbids there.
header_bytes = st.binary(max_size=120).map(lambda b: b.translate(None, b"\r\n\x00").strip())
unicode_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=200)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | unicode_text
# JSON two levels deep (written out: st.recursive's "does extend use its argument" check misfires here).
_json_flat = json_scalars | st.lists(json_scalars, max_size=4) | st.dictionaries(unicode_text, json_scalars, max_size=4)
json_values = _json_flat | st.lists(_json_flat, max_size=3) | st.dictionaries(unicode_text, _json_flat, max_size=3)
events = st.sampled_from(["push", "ping", "pull_request", "release"]) | st.text(max_size=60)

PATHS: list[tuple[str | int, ...]] = [
    ("ref",),
    ("before",),
    ("after",),
    ("repository",),
    ("repository", "full_name"),
    ("repository", "html_url"),
    ("repository", "clone_url"),
    ("commits",),
    ("commits", 0),
    ("commits", 0, "id"),
    ("commits", 0, "message"),
    ("commits", 0, "timestamp"),
    ("commits", 0, "author"),
    ("commits", 0, "author", "name"),
    ("commits", 0, "author", "email"),
    ("commits", 0, "distinct"),
    ("head_commit",),
    ("head_commit", "id"),
    ("head_commit", "author"),
    ("deleted",),
    ("forced",),
    ("created",),
]


@st.composite
def misshapen_pushes(draw: st.DrawFn) -> dict[str, Any]:
    """A push of 1-3 commits with a few fields removed or replaced (by nulls, wrong types, random JSON)."""
    payload = push_payload([sha() for _ in range(draw(st.integers(1, 3)))])
    for path in draw(st.lists(st.sampled_from(PATHS), min_size=1, max_size=4)):
        parent: Any = payload
        for key in path[:-1]:
            parent = parent[key] if isinstance(parent, dict | list) and _has(parent, key) else None
        if not isinstance(parent, dict | list) or not _has(parent, path[-1]):
            continue
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_values)  # type: ignore[index]
    return payload


def _has(container: dict[str, Any] | list[Any], key: str | int) -> bool:
    return key in container if isinstance(container, dict) else isinstance(key, int) and key < len(container)


@st.composite
def unicode_pushes(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed push whose free-text fields are arbitrary unicode (NUL, lone surrogates, astral planes)."""
    payload = push_payload([sha() for _ in range(draw(st.integers(1, 2)))])
    text = unicode_text | st.sampled_from(["\x00", "a\x00b", "\ud800", "x\udfffy", "\U0001f600" * 50, "é" * 300, "\u202e"])
    for commit in payload["commits"]:
        commit["message"] = draw(text)
        commit["author"]["name"] = draw(text)
        commit["author"]["email"] = draw(text)
    payload["head_commit"] = copy.deepcopy(payload["commits"][-1])
    payload["ref"] = "refs/heads/" + draw(st.sampled_from(["main", "dev"]) | unicode_text.filter(bool))
    payload["repository"]["full_name"] = draw(st.just(payload["repository"]["full_name"]) | unicode_text)
    return payload


# --- properties -------------------------------------------------------------------------------------------


@FUZZ
@given(body=st.binary(max_size=4096), event=header_bytes, delivery=header_bytes, sig=header_bytes, content_type=header_bytes)
def test_random_requests_are_refused_and_store_nothing(
    webhook: Webhook, body: bytes, event: bytes, delivery: bytes, sig: bytes, content_type: bytes
) -> None:
    headers = [(b"x-github-event", event), (b"x-github-delivery", delivery), (b"x-hub-signature-256", sig), (b"content-type", content_type)]
    status, stored = webhook.post(body, headers)
    assert status == 401
    assert not stored


@FUZZ
@given(payload=misshapen_pushes() | unicode_pushes(), forge=st.sampled_from(["wrong-secret", "flipped", "other-body", "sha1"]))
def test_a_signature_that_is_not_ours_stores_nothing(webhook: Webhook, payload: dict[str, Any], forge: str) -> None:
    body, headers = signed(SECRET, payload)
    if forge == "wrong-secret":
        headers["X-Hub-Signature-256"] = signature(SECRET + "x", body)
    elif forge == "flipped":
        good = headers["X-Hub-Signature-256"]
        headers["X-Hub-Signature-256"] = good[:-1] + ("0" if good[-1] != "0" else "1")
    elif forge == "other-body":
        body += b" "
    else:
        headers["X-Hub-Signature-256"] = "sha1=" + secrets.token_hex(20)
    status, stored = webhook.post(body, headers)
    assert status == 401
    assert not stored


@FUZZ
@given(body=st.binary(max_size=4096) | json_values.map(lambda v: json.dumps(v).encode()), event=events)
def test_valid_signatures_over_garbage_are_never_a_500(webhook: Webhook, body: bytes, event: str) -> None:
    _, signed_headers = signed(SECRET, body, event="push")
    headers = [(name.lower().encode(), value.encode()) for name, value in signed_headers.items() if name != "X-GitHub-Event"]
    headers.append((b"x-github-event", event.encode("utf-8", "surrogatepass").translate(None, b"\r\n\x00")))
    status, stored = webhook.post(body, headers)
    if status >= 400:
        assert not stored


@FUZZ
@given(payload=misshapen_pushes())
def test_valid_signatures_over_misshapen_pushes_are_400_or_recorded(webhook: Webhook, payload: dict[str, Any]) -> None:
    status, stored = webhook.post(*signed(SECRET, payload))
    assert status in {202, 400}
    if status == 400:
        assert not stored


@FUZZ
@given(payload=unicode_pushes())
def test_unicode_pushes_are_recorded_or_refused_never_a_500(webhook: Webhook, payload: dict[str, Any]) -> None:
    status, stored = webhook.post(*signed(SECRET, payload))
    assert status in {202, 400}
    if status == 400:
        assert not stored


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(overshoot=st.integers(-64, 64), valid=st.booleans(), chunked=st.booleans())
def test_bodies_around_the_size_limit(webhook: Webhook, overshoot: int, valid: bool, chunked: bool) -> None:
    payload = push_payload([sha()])
    payload["head_commit"] = None  # (the same object as the commit: its message would count twice)
    payload["commits"][0]["message"] = ""
    payload["commits"][0]["message"] = "x" * (LIMIT - len(json.dumps(payload).encode()) + overshoot)
    body, headers = signed(SECRET if valid else "not-the-secret", payload)
    assert len(body) == LIMIT + overshoot
    content: bytes | Iterator[bytes] = iter([body[: len(body) // 2], body[len(body) // 2 :]]) if chunked else body
    before = webhook.stored()
    answer = webhook.client.post("/webhooks/github", content=content, headers=headers)  # type: ignore[arg-type]
    if len(body) > LIMIT:
        assert answer.status_code == 413
    else:
        assert answer.status_code == (202 if valid else 401)
    assert (webhook.stored() != before) == (answer.status_code == 202)


def test_a_huge_body_is_413_without_being_read_whole(webhook: Webhook) -> None:
    body = b"{" + b" " * (50 * LIMIT) + b"}"
    status, stored = webhook.post(*signed(SECRET, body))
    assert status == 413
    assert not stored
