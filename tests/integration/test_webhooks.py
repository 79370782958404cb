"""``POST /webhooks/github`` on real PostgreSQL: signature first, what is stored, what is queued, and when.

Payloads are shaped as GitHub sends push events. Each test runs inside a transaction rolled back at the
end; the tests about commit order use a scratch database of their own and real commits.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import Engine, event, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.db import make_engine, session_scope
from service.models import (
    Commit,
    CommitPolicy,
    Delivery,
    DeliveryStatus,
    InstallMode,
    Notification,
    NotificationChannel,
    NotificationStatus,
    Run,
    RunStatus,
)
from service.queue import RUN_SUITE_TASK, SUITE_QUEUE, CeleryProducer
from service.repositories import RepoPolicy
from service.settings import Settings
from service.targets import add_target, make_spec
from service.webhooks import Outcome, RunOptions, ingest, signature
from tests.support.private_servers import wait_for
from tests.support.redis_databases import redis_url

pytestmark = pytest.mark.integration

SECRET = "webhook-test-secret"
REPO = "https://github.com/octo-org/toy-sampler"
ZERO = "0" * 40
REDIS_URL = redis_url("webhooks")  # this test process's own database (tests/support/redis_databases.py)
UNREACHABLE_REDIS_URL = "redis://127.0.0.1:1/0"


# --- payloads as GitHub sends them -------------------------------------------------------------------


def sha() -> str:
    return secrets.token_hex(20)


def repository(full_name: str = "octo-org/toy-sampler") -> dict[str, Any]:
    owner, name = full_name.split("/")
    return {
        "id": 123456789,
        "node_id": "R_kgDOExample",
        "name": name,
        "full_name": full_name,
        "private": False,
        "owner": {"name": owner, "email": None, "login": owner, "id": 1, "type": "Organization"},
        "html_url": f"https://github.com/{full_name}",
        "description": "a toy speculative sampler",
        "fork": False,
        "url": f"https://github.com/{full_name}",
        "git_url": f"git://github.com/{full_name}.git",
        "ssh_url": f"git@github.com:{full_name}.git",
        "clone_url": f"https://github.com/{full_name}.git",
        "default_branch": "main",
        "master_branch": "main",
    }


def commit(sha_: str, message: str, *, minutes: int = 0, distinct: bool = True) -> dict[str, Any]:
    person = {"name": "Ada Lovelace", "email": "ada@example.org", "username": "ada"}
    return {
        "id": sha_,
        "tree_id": sha(),
        "distinct": distinct,
        "message": message,
        "timestamp": (datetime(2026, 3, 1, 12, 0, tzinfo=UTC) + timedelta(minutes=minutes)).astimezone().isoformat(),
        "url": f"https://github.com/octo-org/toy-sampler/commit/{sha_}",
        "author": person,
        "committer": person,
        "added": [],
        "removed": [],
        "modified": ["toy_sampler/sampler.py"],
    }


def push(
    *,
    ref: str = "refs/heads/main",
    before: str | None = None,
    commits: list[dict[str, Any]] | None = None,
    after: str | None = None,
    created: bool = False,
    deleted: bool = False,
    forced: bool = False,
    full_name: str = "octo-org/toy-sampler",
) -> dict[str, Any]:
    commits = [] if commits is None else commits
    head = commits[-1] if commits else None
    after = after or (head["id"] if head else sha())
    before = before or sha()
    return {
        "ref": ref,
        "before": before,
        "after": after,
        "repository": repository(full_name),
        "pusher": {"name": "ada", "email": "ada@example.org"},
        "sender": {"login": "ada", "id": 2, "type": "User"},
        "created": created,
        "deleted": deleted,
        "forced": forced,
        "base_ref": None,
        "compare": f"https://github.com/{full_name}/compare/{before[:12]}...{after[:12]}",
        "commits": commits,
        "head_commit": head,
    }


def ping() -> dict[str, Any]:
    return {
        "zen": "Design for failure.",
        "hook_id": 42,
        "hook": {"type": "Repository", "id": 42, "active": True, "events": ["push"], "config": {"content_type": "json"}},
        "repository": repository(),
        "sender": {"login": "ada", "id": 2, "type": "User"},
    }


# --- the app under test --------------------------------------------------------------------------------


@dataclass
class RecordingProducer:
    """Records the run ids it is asked to send; ``check`` (if set) runs first, e.g. to look at the database."""

    sent: list[int] = field(default_factory=list)
    check: Callable[[int], None] | None = None

    def send_run(self, run_id: int) -> None:
        if self.check is not None:
            self.check(run_id)
        self.sent.append(run_id)


def settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "env": "test",
        "database_url": "postgresql+psycopg://unused",
        "redis_url": UNREACHABLE_REDIS_URL,
        "webhook_secret": SecretStr(SECRET),
    }
    values.update(overrides)
    return Settings(**values)


@dataclass
class Hook:
    client: TestClient
    producer: Any
    factory: sessionmaker[Session]

    def post(
        self,
        payload: dict[str, Any] | None,
        *,
        event: str = "push",
        delivery: str | None = None,
        body: bytes | None = None,
        secret: str = SECRET,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        raw = body if body is not None else json.dumps(payload).encode()
        sent = {
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/abc1234",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery or secrets.token_hex(16),
            "X-GitHub-Hook-ID": "42",
            "X-Hub-Signature-256": signature(secret, raw),
        }
        sent.update(headers or {})
        return self.client.post("/webhooks/github", content=raw, headers=sent)

    def add_target(
        self,
        name: str = "toy",
        *,
        repo: str = REPO,
        branches: tuple[str, ...] = ("main",),
        policy: CommitPolicy = CommitPolicy.head,
        install: InstallMode = InstallMode.source,
    ) -> None:
        spec = make_spec(
            name=name,
            repo_url=repo,
            branches=branches,
            adapter="toy_sampler.sampler:sample",
            install_mode=install,
            commit_policy=policy,
            # Matching is tested on every URL form a target may have (ssh, git://, local): all allowed.
            repo_policy=RepoPolicy(protocols=frozenset({"https", "ssh", "http", "git"}), allow_local=True, allow_private_hosts=True),
        )
        with session_scope(self.factory) as session:
            add_target(session, spec)

    def count(self, model: type[Any]) -> int:
        with session_scope(self.factory) as session:
            return session.scalar(select(func.count()).select_from(model)) or 0

    def runs(self) -> list[Run]:
        with session_scope(self.factory) as session:
            return list(session.scalars(select(Run).order_by(Run.id)))

    def commits(self) -> list[Commit]:
        with session_scope(self.factory) as session:
            return list(session.scalars(select(Commit).order_by(Commit.branch_order)))

    def deliveries(self) -> list[Delivery]:
        with session_scope(self.factory) as session:
            return list(session.scalars(select(Delivery).order_by(Delivery.id)))

    def nothing_stored(self) -> bool:
        return all(self.count(model) == 0 for model in (Delivery, Commit, Run))


@contextmanager
def make_hook(factory: sessionmaker[Session], producer: Any, **overrides: Any) -> Iterator[Hook]:
    app = create_app(settings(**overrides), session_factory=factory, producer=producer)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Hook(client, producer, factory)


@pytest.fixture
def hook(rolled_back_factory: sessionmaker[Session]) -> Iterator[Hook]:
    with make_hook(rolled_back_factory, RecordingProducer()) as hook:
        yield hook


# --- rejected requests: nothing stored -------------------------------------------------------------------


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param({"secret": "not-the-secret"}, id="wrong-secret"),
        pytest.param({"headers": {"X-Hub-Signature-256": "sha256=" + "0" * 64}}, id="forged"),
        pytest.param({"headers": {"X-Hub-Signature-256": ""}}, id="missing"),
        pytest.param({"headers": {"X-Hub-Signature-256": "sha1=abc"}}, id="sha1-only"),
    ],
)
def test_a_bad_signature_is_401_and_stores_nothing(hook: Hook, mangle: dict[str, Any]) -> None:
    hook.add_target()
    answer = hook.post(push(commits=[commit(sha(), "change")]), **mangle)

    assert answer.status_code == 401, answer.text
    assert hook.nothing_stored()
    assert hook.producer.sent == []


def test_a_body_changed_after_signing_is_401(hook: Hook) -> None:
    hook.add_target()
    raw = json.dumps(push(commits=[commit(sha(), "change")])).encode()
    answer = hook.post(None, body=raw.replace(b"change", b"chanGe"), headers={"X-Hub-Signature-256": signature(SECRET, raw)})

    assert answer.status_code == 401
    assert hook.nothing_stored()


def test_without_a_configured_secret_every_webhook_is_refused(rolled_back_factory: sessionmaker[Session]) -> None:
    with make_hook(rolled_back_factory, RecordingProducer(), webhook_secret=SecretStr("")) as hook:
        answer = hook.post(ping(), event="ping", secret="")
        assert answer.status_code == 401
        assert "SPECWATCH_WEBHOOK_SECRET" in answer.json()["detail"]
        assert hook.nothing_stored()


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"", b"\xff\xfe", b"[1, 2]", b'"a string"'],
    ids=["broken", "empty", "not-utf8", "array", "string"],
)
def test_malformed_json_is_400_and_stores_nothing(hook: Hook, body: bytes) -> None:
    hook.add_target()
    answer = hook.post(None, body=body)

    assert answer.status_code == 400, answer.text
    assert hook.nothing_stored()


def test_a_push_payload_without_its_fields_is_400(hook: Hook) -> None:
    hook.add_target()
    payload = push(commits=[commit("not-a-sha", "x")])
    del payload["ref"]
    answer = hook.post(payload)

    assert answer.status_code == 400
    assert "ref" in answer.json()["detail"]
    assert hook.nothing_stored()


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"ref": "refs/heads/\x00x"}, id="nul-in-ref"),
        pytest.param({"ref": "refs/heads/ma\x00in"}, id="nul-inside-a-watched-name"),
        pytest.param({"ref": "refs/heads/\ud800x"}, id="lone-surrogate-in-ref"),
        pytest.param({"ref": "refs/heads/a\x01b"}, id="control-character-in-ref"),
        pytest.param({"ref": "refs/heads/a..b"}, id="two-dots-in-ref"),
        pytest.param({"after": "b" * 39 + "\x00"}, id="nul-in-after"),
    ],
)
def test_refs_and_commit_ids_are_checked_as_git_would_and_nul_is_400(hook: Hook, fields: dict[str, str]) -> None:
    """A ref or commit id that git never allows is refused as sent (the body holds ``\\u0000``, as JSON escapes
    it), not repaired into another, valid-looking name and accepted (issue 42)."""
    hook.add_target()
    payload = push(commits=[commit(sha(), "change")]) | fields
    body = json.dumps(payload).encode()
    assert b"\\u0000" in body or b"\\ud800" in body or b"\\u0001" in body or b".." in body

    answer = hook.post(None, body=body)

    assert answer.status_code == 400, answer.text
    assert next(iter(fields)) in answer.json()["detail"]
    assert hook.nothing_stored()


def test_missing_github_headers_are_400(hook: Hook) -> None:
    answer = hook.post(ping(), headers={"X-GitHub-Delivery": ""})
    assert answer.status_code == 400
    assert "X-GitHub-Delivery" in answer.json()["detail"]
    assert hook.nothing_stored()


def test_an_oversized_body_is_413_and_stores_nothing(rolled_back_factory: sessionmaker[Session]) -> None:
    with make_hook(rolled_back_factory, RecordingProducer(), webhook_max_body_bytes=2048) as hook:
        hook.add_target()
        payload = push(commits=[commit(sha(), "x" * 4096)])
        answer = hook.post(payload)

        assert answer.status_code == 413, answer.text
        assert hook.nothing_stored()


def test_an_oversized_body_without_content_length_is_413_while_streaming(rolled_back_factory: sessionmaker[Session]) -> None:
    with make_hook(rolled_back_factory, RecordingProducer(), webhook_max_body_bytes=2048) as hook:
        hook.add_target()
        raw = json.dumps(push(commits=[commit(sha(), "x" * 4096)])).encode()
        chunks = iter([raw[i : i + 512] for i in range(0, len(raw), 512)])
        headers = {
            "Content-Type": "application/json",
            "X-GitHub-Event": "push",
            "X-GitHub-Delivery": "streamed",
            "X-Hub-Signature-256": signature(SECRET, raw),
        }
        answer = hook.client.post("/webhooks/github", content=chunks, headers=headers)

        assert answer.request.headers.get("content-length") is None
        assert answer.status_code == 413, answer.text
        assert hook.nothing_stored()


# --- accepted deliveries -----------------------------------------------------------------------------------


def test_ping_is_200_and_recorded_as_ignored(hook: Hook) -> None:
    answer = hook.post(ping(), event="ping", delivery="ping-1")

    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "ignored"
    [delivery] = hook.deliveries()
    assert (delivery.github_delivery_id, delivery.event, delivery.status) == ("ping-1", "ping", DeliveryStatus.ignored)
    assert hook.producer.sent == []


def test_a_push_records_commits_and_queues_a_run_for_the_head(hook: Hook) -> None:
    hook.add_target(policy=CommitPolicy.head)
    shas = [sha(), sha(), sha()]
    before = sha()
    answer = hook.post(push(before=before, commits=[commit(s, f"change {i}\n\nbody", minutes=i) for i, s in enumerate(shas)]))

    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert (body["outcome"], body["commits"]) == ("accepted", 3)
    commits = hook.commits()
    assert [c.sha for c in commits] == shas
    assert [c.branch_order for c in commits] == [1, 2, 3]
    first = commits[0]
    assert (first.branch, first.author, first.message) == ("main", "Ada Lovelace <ada@example.org>", "change 0\n\nbody")
    # No parents in the payload: each listed commit is the next one's first parent, the first one's is ``before``.
    assert [c.parents for c in commits] == [[before], [shas[0]], [shas[1]]]
    assert first.committed_at == datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    [run] = hook.runs()
    assert run.commit_id == commits[-1].id
    assert (run.status, run.profile, run.attempt) == (RunStatus.queued, "default", 0)
    assert run.lease_expires_at is not None
    assert run.lease_expires_at > datetime.now(UTC)
    assert body["runs"] == [run.id]
    assert hook.producer.sent == [run.id]
    [delivery] = hook.deliveries()
    assert delivery.status is DeliveryStatus.accepted
    assert (delivery.ref, delivery.before_sha, delivery.after_sha, delivery.forced) == ("refs/heads/main", before, shas[-1], False)


def test_policy_every_queues_a_run_per_commit_in_branch_order(hook: Hook) -> None:
    hook.add_target(policy=CommitPolicy.every)
    shas = [sha(), sha(), sha()]
    answer = hook.post(push(commits=[commit(s, f"change {i}") for i, s in enumerate(shas)]))

    assert answer.status_code == 202
    runs = hook.runs()
    by_id = {c.id: c.sha for c in hook.commits()}
    assert [by_id[r.commit_id] for r in runs] == shas
    assert hook.producer.sent == [r.id for r in runs]


def test_with_a_github_token_each_queued_run_gets_a_pending_status_in_the_outbox(rolled_back_factory: sessionmaker[Session]) -> None:
    token = SecretStr("ghp_test-token")
    with make_hook(rolled_back_factory, RecordingProducer(), github_token=token, dashboard_url="https://sw.example.com/") as hook:
        hook.add_target(policy=CommitPolicy.every)
        shas = [sha(), sha()]
        payload = push(commits=[commit(s, f"change {i}") for i, s in enumerate(shas)])
        assert hook.post(payload, delivery="d-1").status_code == 202
        assert hook.post(payload, delivery="d-1").json()["outcome"] == "duplicate"

        runs = hook.runs()
        with session_scope(rolled_back_factory) as session:
            rows = list(session.scalars(select(Notification).order_by(Notification.id)))
        assert [(r.channel, r.event, r.status, r.run_id) for r in rows] == [
            (NotificationChannel.github, "pending", NotificationStatus.pending, run.id) for run in runs
        ]
        assert [r.payload["sha"] for r in rows] == shas
        assert {r.payload["repo"] for r in rows} == {"octo-org/toy-sampler"}
        assert [r.payload["target_url"] for r in rows] == [f"https://sw.example.com/ui/runs/{run.id}" for run in runs]
        assert all("ghp_" not in json.dumps(r.payload) for r in rows)


def test_without_a_github_token_no_status_is_written(hook: Hook) -> None:
    hook.add_target()
    assert hook.post(push(commits=[commit(sha(), "change")])).status_code == 202
    assert len(hook.runs()) == 1
    assert hook.count(Notification) == 0


def test_a_redelivery_is_a_no_op(hook: Hook) -> None:
    hook.add_target()
    payload = push(commits=[commit(sha(), "change")])
    first = hook.post(payload, delivery="d-1")
    again = hook.post(payload, delivery="d-1")

    assert (first.status_code, again.status_code) == (202, 202)
    assert again.json()["outcome"] == "duplicate"
    assert again.json()["runs"] == []
    assert len(hook.runs()) == 1
    assert len(hook.deliveries()) == 1
    assert hook.producer.sent == first.json()["runs"]


def test_the_same_head_pushed_again_gets_no_second_run(hook: Hook) -> None:
    hook.add_target(branches=("main", "release"))
    head = commit(sha(), "change")
    hook.post(push(commits=[head]))
    again = hook.post(push(ref="refs/heads/release", commits=[], after=head["id"], created=True) | {"head_commit": head})

    assert again.status_code == 202
    assert again.json()["outcome"] == "ignored"
    assert len(hook.runs()) == 1
    assert len(hook.commits()) == 1


def test_branch_order_continues_across_pushes_and_forced_pushes_are_recorded(hook: Hook) -> None:
    hook.add_target(policy=CommitPolicy.every)
    old = [sha(), sha()]
    hook.post(push(commits=[commit(s, "old") for s in old]))
    rewritten = [sha()]
    answer = hook.post(push(before=old[-1], commits=[commit(s, "rewritten") for s in rewritten], forced=True), delivery="forced-1")

    assert answer.status_code == 202
    assert "forced push" in answer.json()["reason"]
    assert [(c.sha, c.branch_order) for c in hook.commits()] == [(old[0], 1), (old[1], 2), (rewritten[0], 3)]
    forced = next(d for d in hook.deliveries() if d.github_delivery_id == "forced-1")
    assert (forced.forced, forced.before_sha, forced.after_sha) == (True, old[-1], rewritten[0])


def test_an_unknown_repository_is_202_with_a_reason_and_nothing_queued(hook: Hook) -> None:
    hook.add_target()
    answer = hook.post(push(commits=[commit(sha(), "x")], full_name="someone/else"))

    assert answer.status_code == 202
    assert answer.json()["outcome"] == "ignored"
    assert "someone/else is not a registered target" in answer.json()["reason"]
    [delivery] = hook.deliveries()
    assert delivery.status is DeliveryStatus.ignored
    assert delivery.reason == answer.json()["reason"]
    assert (hook.count(Commit), hook.count(Run), hook.producer.sent) == (0, 0, [])


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        pytest.param(lambda: push(before=sha(), after=ZERO, deleted=True), "deleted", id="deleted-branch"),
        pytest.param(lambda: push(ref="refs/tags/v1.0", commits=[commit(sha(), "release")], created=True), "tag", id="tag"),
        pytest.param(lambda: push(ref="refs/heads/feature", commits=[commit(sha(), "wip")]), "not watched", id="unwatched"),
    ],
)
def test_pushes_that_queue_nothing(hook: Hook, payload: Callable[[], dict[str, Any]], reason: str) -> None:
    hook.add_target()
    answer = hook.post(payload())

    assert answer.status_code == 202
    assert answer.json()["outcome"] == "ignored"
    assert reason in answer.json()["reason"]
    assert (hook.count(Commit), hook.count(Run), hook.producer.sent) == (0, 0, [])
    assert [d.status for d in hook.deliveries()] == [DeliveryStatus.ignored]


def test_the_repository_matches_whatever_url_form_the_target_was_given(hook: Hook) -> None:
    hook.add_target("ssh", repo="git@github.com:Octo-Org/toy-sampler.git")
    hook.add_target("https", repo="https://github.com/octo-org/toy-sampler/")
    hook.add_target("other", repo="https://github.com/octo-org/another")
    answer = hook.post(push(commits=[commit(sha(), "x")]))

    assert answer.status_code == 202
    assert len(answer.json()["runs"]) == 2
    assert hook.count(Commit) == 2


def test_pip_targets_are_not_tested_from_pushes(hook: Hook) -> None:
    hook.add_target(install=InstallMode.pip)
    answer = hook.post(push(commits=[commit(sha(), "x")]))

    assert answer.status_code == 202
    assert answer.json()["outcome"] == "ignored"
    assert "releases" in answer.json()["reason"]
    assert hook.producer.sent == []


def test_form_encoded_deliveries_are_accepted(hook: Hook) -> None:
    hook.add_target()
    raw = urlencode({"payload": json.dumps(push(commits=[commit(sha(), "x")]))}).encode()
    answer = hook.post(None, body=raw, headers={"Content-Type": "application/x-www-form-urlencoded"})

    assert answer.status_code == 202, answer.text
    assert len(answer.json()["runs"]) == 1


# --- enqueue after commit ------------------------------------------------------------------------------------


@pytest.fixture
def own_database(create_migrated_postgres_database: Callable[[], str]) -> Iterator[Engine]:
    """A database of this test's own, for tests that must see real commits from another connection."""
    engine = make_engine(create_migrated_postgres_database())
    yield engine
    engine.dispose()


def test_runs_are_enqueued_only_after_their_transaction_committed(own_database: Engine) -> None:
    observer = make_engine(own_database.url.render_as_string(hide_password=False))
    seen: list[tuple[int, str]] = []

    def committed(run_id: int) -> None:
        with observer.connect() as connection:  # another connection sees only committed rows
            status = connection.execute(text("SELECT status FROM runs WHERE id = :id"), {"id": run_id}).scalar_one_or_none()
        seen.append((run_id, status))

    producer = RecordingProducer(check=committed)
    try:
        with make_hook(sessionmaker(bind=own_database, expire_on_commit=False), producer) as hook:
            hook.add_target(policy=CommitPolicy.every)
            answer = hook.post(push(commits=[commit(sha(), "a"), commit(sha(), "b")]))
            assert answer.status_code == 202
    finally:
        observer.dispose()

    assert seen == [(run_id, "queued") for run_id in answer.json()["runs"]]
    assert len(seen) == 2


def test_nothing_is_enqueued_when_the_commit_fails(rolled_back_factory: sessionmaker[Session]) -> None:
    producer = RecordingProducer()
    with make_hook(rolled_back_factory, producer) as hook:
        hook.add_target()

        def fail(_: Session) -> None:
            raise RuntimeError("database went away at commit")

        event.listen(rolled_back_factory, "before_commit", fail)
        try:
            answer = hook.post(push(commits=[commit(sha(), "x")]))
        finally:
            event.remove(rolled_back_factory, "before_commit", fail)

        assert answer.status_code == 500
        assert producer.sent == []
        assert hook.nothing_stored()


def test_with_redis_unreachable_the_delivery_and_queued_runs_are_stored_and_the_answer_is_202(
    rolled_back_factory: sessionmaker[Session],
) -> None:
    producer = CeleryProducer(UNREACHABLE_REDIS_URL)
    try:
        with make_hook(rolled_back_factory, producer) as hook:
            hook.add_target(policy=CommitPolicy.every)
            answer = hook.post(push(commits=[commit(sha(), "a"), commit(sha(), "b")]))

            assert answer.status_code == 202, answer.text
            assert answer.json()["outcome"] == "accepted"
            runs = hook.runs()
            assert [r.id for r in runs] == answer.json()["runs"]
            assert {r.status for r in runs} == {RunStatus.queued}
            # The sweeper re-enqueues them once this lease has expired.
            assert all(r.lease_expires_at is not None and r.lease_expires_at > datetime.now(UTC) for r in runs)
            assert [d.status for d in hook.deliveries()] == [DeliveryStatus.accepted]
    finally:
        producer.close()


def test_runs_reach_the_gpu_queue_on_real_redis_by_task_name(rolled_back_factory: sessionmaker[Session]) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    producer = CeleryProducer(REDIS_URL)
    ours: list[bytes] = []
    try:
        with make_hook(rolled_back_factory, producer) as hook:
            hook.add_target()
            answer = hook.post(push(commits=[commit(sha(), "a")]))
            [run_id] = answer.json()["runs"]

        for raw in client.lrange(SUITE_QUEUE, 0, -1):
            message = json.loads(raw)
            args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
            if message["headers"]["task"] == RUN_SUITE_TASK and args == [run_id]:
                ours.append(raw)
        assert len(ours) == 1
        assert json.loads(ours[0])["properties"]["delivery_info"]["routing_key"] == SUITE_QUEUE
    finally:
        for raw in ours:
            client.lrem(SUITE_QUEUE, 1, raw)
        producer.close()
        client.close()


def test_healthz(hook: Hook) -> None:
    answer = hook.client.get("/healthz")
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}


def test_a_push_and_its_redelivery_on_each_backend(migrated_database_url: str) -> None:
    """The embedded default (SQLite) and production (PostgreSQL) record and deduplicate alike."""
    engine = make_engine(migrated_database_url)
    try:
        producer = RecordingProducer()
        with make_hook(sessionmaker(bind=engine, expire_on_commit=False), producer) as hook:
            hook.add_target(policy=CommitPolicy.every)
            payload = push(commits=[commit(sha(), "a"), commit(sha(), "b")])
            first = hook.post(payload, delivery="same")
            again = hook.post(payload, delivery="same")

            assert (first.status_code, again.status_code) == (202, 202)
            assert again.json()["outcome"] == "duplicate"
            assert [r.id for r in hook.runs()] == first.json()["runs"] == producer.sent
            assert len(first.json()["runs"]) == 2
            assert [d.status for d in hook.deliveries()] == [DeliveryStatus.accepted]
    finally:
        engine.dispose()


def test_concurrent_deliveries_with_one_id_record_it_once(own_database: Engine) -> None:
    """The second request waits on the first one's uncommitted delivery row, then records nothing."""
    factory = sessionmaker(bind=own_database, expire_on_commit=False)
    with session_scope(factory) as session:
        add_target(session, make_spec(name="toy", repo_url=REPO, branches=["main"], adapter="toy:f"))
    payload = push(commits=[commit(sha(), "a")])
    options = RunOptions(profile="default", queued_lease=timedelta(minutes=5))

    first = factory()
    try:
        assert ingest(first, delivery_id="race", event="push", payload=payload, options=options).outcome is Outcome.accepted
        with ThreadPoolExecutor(1) as pool:
            second = pool.submit(_ingest_in_own_session, factory, payload, options)
            # The second request reaches the delivery insert and waits on the first one's row lock.
            wait_for(lambda: _waiting_on_a_lock(own_database) == 1, timeout_s=30, what="the second request's lock wait")
            assert not second.done()
            first.commit()
            assert second.result(timeout=30) is Outcome.duplicate
    finally:
        first.close()
    with session_scope(factory) as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 1


def _waiting_on_a_lock(engine: Engine) -> int:
    with engine.connect() as connection:
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        return int(connection.execute(text(query)).scalar_one())


def _ingest_in_own_session(factory: sessionmaker[Session], payload: dict[str, Any], options: RunOptions) -> Outcome:
    with session_scope(factory) as session:
        return ingest(session, delivery_id="race", event="push", payload=payload, options=options).outcome
