"""Size limits on what a signed delivery stores and echoes (issue 28, item 6), on real PostgreSQL.

A signed payload is trusted to come from GitHub, not to be small: a ping's 9 MB ``zen`` was stored and echoed
whole, a 5 MB commit message made the branch's timeline page 5 MB per commit. Every stored field is cut with
a marker; the memory figures (RSS back near its baseline after 8 such deliveries) come from
``bench/webhook_hostile.py --probe large``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.db import session_scope
from service.ingest import AUTHOR_MAX, COMMIT_MESSAGE_MAX
from service.models import Commit, Delivery
from service.repositories import RepoPolicy
from service.settings import Settings
from service.targets import add_target, make_spec
from service.textlimits import CUT_MARKER
from service.webhooks.deliveries import REASON_MAX, ZEN_MAX
from tests.support.pushes import REPO_URL, push_payload, signed

pytestmark = pytest.mark.integration

SECRET = "limits-secret"
MB = 1_000_000


@dataclass
class Hook:
    client: TestClient
    factory: sessionmaker[Session]

    def post(self, payload: dict[str, object], event: str = "push") -> httpx.Response:
        content, headers = signed(SECRET, json.dumps(payload).encode(), event=event)
        return self.client.post("/webhooks/github", content=content, headers=headers)


class NoQueue:
    def send_run(self, run_id: int) -> None:
        """Runs are not what these tests look at."""


@pytest.fixture
def hook(rolled_back_factory: sessionmaker[Session]) -> Iterator[Hook]:
    settings = Settings(env="test", database_url="postgresql+psycopg://unused", webhook_secret=SecretStr(SECRET))
    app = create_app(settings, session_factory=rolled_back_factory, producer=NoQueue())
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Hook(client, rolled_back_factory)


def _watch(factory: sessionmaker[Session]) -> None:
    policy = RepoPolicy(protocols=frozenset({"https"}), allow_local=False, allow_private_hosts=False)
    spec = make_spec(name="limits", repo_url=REPO_URL, branches=("main",), adapter="toy_sampler.sampler:sample", repo_policy=policy)
    with session_scope(factory) as session:
        add_target(session, spec)


def test_a_pings_9_mb_zen_is_neither_stored_nor_echoed_whole(hook: Hook) -> None:
    answer = hook.post({"zen": "z" * (9 * MB), "hook_id": 1}, event="ping")
    assert answer.status_code == 200, answer.text[:200]
    assert len(answer.content) < 1000
    reason = answer.json()["reason"]
    assert reason == f"ping (zen: {'z' * (ZEN_MAX - len(CUT_MARKER))}{CUT_MARKER})"
    with session_scope(hook.factory) as session:
        (stored,) = session.scalars(select(Delivery.reason))
    assert stored == reason


def test_a_5_mb_commit_message_and_a_long_author_are_stored_cut_and_the_timeline_stays_small(hook: Hook) -> None:
    _watch(hook.factory)
    payload = push_payload(message="first line " + "m" * (5 * MB))
    for pushed in payload["commits"]:
        pushed["author"] = {"name": "A" * 100_000, "email": "ada@example.org"}
    answer = hook.post(payload)
    assert answer.status_code == 202, answer.text[:200]
    with session_scope(hook.factory) as session:
        (stored,) = session.scalars(select(Commit))
        assert stored.message is not None
        assert stored.author is not None
        assert len(stored.message) == COMMIT_MESSAGE_MAX
        assert stored.message.startswith("first line mmm")
        assert stored.message.endswith(CUT_MARKER)
        assert len(stored.author) == AUTHOR_MAX
        assert stored.author.endswith(CUT_MARKER)
    page = hook.client.get("/ui/targets/limits")
    assert page.status_code == 200
    assert "first line mmm" in page.text
    assert len(page.content) < 50_000


def test_an_unknown_repositorys_long_name_is_cut_in_the_reason(hook: Hook) -> None:
    payload = push_payload()
    payload["repository"]["full_name"] = "octo/" + "r" * (2 * MB)
    answer = hook.post(payload)
    assert answer.status_code == 202
    reason = answer.json()["reason"]
    assert CUT_MARKER in reason
    assert len(reason) <= REASON_MAX
