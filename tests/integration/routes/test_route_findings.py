"""The known findings API on real PostgreSQL: CRUD with the API's auth (reads open or token-gated, writes need a
write token), 404/409/422 with the reason, seeding (when a transformers target is added, and idempotent on
request), and the findings going with their target."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.auth import hash_token
from service.models import KnownFinding
from service.settings import Settings
from specwatch.findings import shipped_findings

pytestmark = pytest.mark.integration

WRITE_TOKEN, READ_TOKEN = "findings-write-token", "findings-read-token"
WRITE = {"Authorization": f"Bearer {WRITE_TOKEN}"}
READ = {"Authorization": f"Bearer {READ_TOKEN}"}
TRANSFORMERS = {
    "name": "transformers",
    "repo_url": "https://github.com/huggingface/transformers",
    "branches": ["main"],
    "adapter": "transformers",
}
TOY = {"name": "toy", "repo_url": "https://github.com/octo-org/toy", "branches": ["main"], "adapter": "toy_lib.sampler:sample"}
FINDING: dict[str, Any] = {
    "key": "toy-residual",
    "title": "The toy sampler swaps its residual",
    "cases": ["direct/far_apart/*", "direct/near/V8/g2"],
    "link": "https://github.com/octo-org/toy/issues/7",
    "versions": ">=0.1",
}


class NoProducer:
    def send_run(self, run_id: int) -> None:
        raise AssertionError(f"nothing should be enqueued (run {run_id})")


@pytest.fixture
def make_client(rolled_back_factory: sessionmaker[Session]) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(**changes: Any) -> TestClient:
        settings = Settings(
            **{
                "env": "test",
                "database_url": "postgresql+psycopg://unused",
                "webhook_secret": SecretStr("x"),
                "api_token_hashes": [hash_token(WRITE_TOKEN)],
                "api_read_token_hashes": [hash_token(READ_TOKEN)],
            }
            | changes
        )
        client = TestClient(create_app(settings, session_factory=rolled_back_factory, producer=NoProducer()))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    client = make_client()
    assert client.post("/targets", json=TOY, headers=WRITE).status_code == 201
    return client


def test_add_read_edit_and_remove_a_finding(client: TestClient) -> None:
    assert client.get("/targets/toy/findings").json() == []  # a module:function target has no shipped findings
    created = client.post("/targets/toy/findings", json=FINDING, headers=WRITE)
    assert created.status_code == 201, created.text
    body = created.json()
    assert {k: body[k] for k in FINDING} == FINDING
    assert (body["state"], body["fixed_in"], body["commit_from"], body["updated_at"]) == ("open", None, None, None)
    assert [f["key"] for f in client.get("/targets/toy/findings").json()] == ["toy-residual"]
    assert client.get("/targets/toy/findings/toy-residual").json()["title"] == FINDING["title"]

    change = {"state": "fixed", "fixed_in": "0.3.0", "versions": ">=0.1,<0.3"}
    changed = client.patch("/targets/toy/findings/toy-residual", json=change, headers=WRITE)
    assert changed.status_code == 200, changed.text
    assert {k: changed.json()[k] for k in change} == change
    assert changed.json()["title"] == FINDING["title"]  # untouched
    assert changed.json()["updated_at"] is not None
    cleared = client.patch("/targets/toy/findings/toy-residual", json={"versions": None}, headers=WRITE)
    assert cleared.json()["versions"] is None

    assert client.delete("/targets/toy/findings/toy-residual", headers=WRITE).status_code == 204
    assert client.get("/targets/toy/findings").json() == []
    assert client.get("/targets/toy/findings/toy-residual").status_code == 404


def test_a_finding_names_its_distributions_and_an_edit_clears_them(client: TestClient) -> None:
    created = client.post("/targets/toy/findings", json=FINDING | {"distributions": ["Toy_CPU"]}, headers=WRITE)
    assert created.status_code == 201, created.text
    assert created.json()["distributions"] == ["toy-cpu"]  # normalised
    assert client.get("/targets/toy/findings/toy-residual").json()["distributions"] == ["toy-cpu"]
    changed = client.patch("/targets/toy/findings/toy-residual", json={"distributions": ["toy", "toy-cpu"]}, headers=WRITE)
    assert changed.json()["distributions"] == ["toy", "toy-cpu"]
    cleared = client.patch("/targets/toy/findings/toy-residual", json={"distributions": None}, headers=WRITE)
    assert cleared.json()["distributions"] == []  # any distribution
    bad = client.patch("/targets/toy/findings/toy-residual", json={"distributions": ["toy cpu"]}, headers=WRITE)
    assert bad.status_code == 422
    assert "invalid distribution 'toy cpu'" in bad.json()["detail"]
    assert client.post("/targets/toy/findings", json=FINDING | {"key": "plain"}, headers=WRITE).json()["distributions"] == []


def test_writes_need_a_write_token_and_reads_follow_read_auth(make_client: Callable[..., TestClient]) -> None:
    client = make_client(api_auth_reads=True)
    assert client.post("/targets", json=TOY, headers=WRITE).status_code == 201
    assert client.post("/targets/toy/findings", json=FINDING, headers=WRITE).status_code == 201
    path = "/targets/toy/findings/toy-residual"
    for method, url, body in [
        ("POST", "/targets/toy/findings", FINDING | {"key": "other"}),
        ("PATCH", path, {"title": "changed"}),
        ("DELETE", path, None),
        ("POST", "/targets/toy/findings/seed", None),
    ]:
        assert client.request(method, url, json=body).status_code == 401, (method, url)
        assert client.request(method, url, json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.request(method, url, json=body, headers=READ).status_code == 403, (method, url)
    assert client.get("/targets/toy/findings").status_code == 401
    assert client.get("/targets/toy/findings", headers=READ).json()[0]["title"] == FINDING["title"]  # nothing changed
    assert client.get(path, headers=READ).status_code == 200
    open_reads = make_client()
    assert open_reads.get("/targets/toy/findings").status_code == 200


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"versions": "4.52+"}, "PEP 440 specifier set"),
        ({"cases": ["a b"]}, "invalid case glob"),
        ({"link": "javascript:alert(1)"}, "invalid link"),
        ({"key": "Not A Key"}, "invalid key"),
        ({"fixed_in": "0.3"}, "set its state to fixed"),
    ],
)
def test_invalid_findings_are_422_with_the_reason(client: TestClient, change: dict[str, Any], message: str) -> None:
    answer = client.post("/targets/toy/findings", json=FINDING | change, headers=WRITE)
    assert answer.status_code == 422
    assert message in answer.json()["detail"]
    assert client.get("/targets/toy/findings").json() == []


def test_duplicates_unknown_targets_and_bad_edits(client: TestClient) -> None:
    assert client.post("/targets/toy/findings", json=FINDING, headers=WRITE).status_code == 201
    again = client.post("/targets/toy/findings", json=FINDING, headers=WRITE)
    assert again.status_code == 409
    assert "already" in again.json()["detail"]
    assert client.post("/targets/nope/findings", json=FINDING, headers=WRITE).status_code == 404
    assert client.get("/targets/nope/findings").status_code == 404
    assert client.patch("/targets/toy/findings/nope", json={"title": "x"}, headers=WRITE).status_code == 404
    assert client.patch("/targets/toy/findings/toy-residual", json={"key": "x"}, headers=WRITE).status_code == 422  # extra="forbid"
    bad = client.patch("/targets/toy/findings/toy-residual", json={"commit_to": "abcdef1"}, headers=WRITE)
    assert bad.status_code == 422
    assert "first affected commit" in bad.json()["detail"]


def test_a_transformers_target_is_seeded_when_added_and_seeding_again_adds_nothing(
    make_client: Callable[..., TestClient], rolled_back_factory: sessionmaker[Session]
) -> None:
    client = make_client()
    assert client.post("/targets", json=TRANSFORMERS, headers=WRITE).status_code == 201
    shipped = shipped_findings("transformers")
    listed = client.get("/targets/transformers/findings").json()
    assert [f["key"] for f in listed] == [f.key for f in shipped]
    assert {f["link"] for f in listed} == {f.link for f in shipped}

    # An edit survives seeding; a removed finding comes back; nothing is duplicated.
    key = shipped[0].key
    assert client.patch(f"/targets/transformers/findings/{key}", json={"title": "edited here"}, headers=WRITE).status_code == 200
    assert client.delete(f"/targets/transformers/findings/{shipped[1].key}", headers=WRITE).status_code == 204
    seeded = client.post("/targets/transformers/findings/seed", headers=WRITE)
    assert seeded.status_code == 200, seeded.text
    assert seeded.json()["added"] == [shipped[1].key]
    assert len(seeded.json()["kept"]) == len(shipped) - 1
    again = client.post("/targets/transformers/findings/seed", headers=WRITE).json()
    assert (again["added"], len(again["kept"])) == ([], len(shipped))
    assert client.get(f"/targets/transformers/findings/{key}").json()["title"] == "edited here"

    # The findings go with their target.
    assert client.delete("/targets/transformers", headers=WRITE).status_code == 204
    with rolled_back_factory() as session:
        assert session.scalar(select(func.count()).select_from(KnownFinding)) == 0
