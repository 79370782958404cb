"""The targets REST API on real PostgreSQL: list, add (201, 409, 422), remove (204, 404)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.auth import hash_token
from service.settings import Settings

pytestmark = pytest.mark.integration

TRANSFORMERS = {
    "name": "transformers",
    "repo_url": "https://github.com/huggingface/transformers",
    "branches": ["main"],
    "adapter": "transformers",
    "poll": "10m",
}


TOKEN = "targets-test-token"


class NoProducer:
    def send_run(self, run_id: int) -> None:
        raise AssertionError(f"nothing should be enqueued (run {run_id})")


@pytest.fixture
def client(rolled_back_factory: sessionmaker[Session]) -> Iterator[TestClient]:
    settings = Settings(
        env="test", database_url="postgresql+psycopg://unused", webhook_secret=SecretStr("x"), api_token_hashes=[hash_token(TOKEN)]
    )
    with TestClient(create_app(settings, session_factory=rolled_back_factory, producer=NoProducer())) as client:
        # Writes need a write token (service.auth; its refusals are tested in test_route_queries.py).
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield client


def test_add_list_and_remove(client: TestClient) -> None:
    assert client.get("/targets").json() == []

    created = client.post("/targets", json=TRANSFORMERS)
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["name"], body["install_mode"], body["commit_policy"], body["poll_interval_s"]) == ("transformers", "source", "head", 600)
    assert body["created_at"] is not None

    assert [t["name"] for t in client.get("/targets").json()] == ["transformers"]
    assert client.delete("/targets/transformers").status_code == 204
    assert client.get("/targets").json() == []


def test_a_duplicate_is_409(client: TestClient) -> None:
    assert client.post("/targets", json=TRANSFORMERS).status_code == 201
    again = client.post("/targets", json=TRANSFORMERS | {"adapter": "toy:f"})
    assert again.status_code == 409
    assert "exists already" in again.json()["detail"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"adapter": "tensorrt_llm"}, "unknown adapter"),
        ({"repo_url": "nope"}, "invalid repository"),
        ({"branches": ["a b"]}, "invalid branch"),
        ({"poll": "1s"}, "too short"),
        ({"name": "bad name"}, "invalid target name"),
    ],
)
def test_invalid_targets_are_422_with_the_reason(client: TestClient, change: dict[str, object], message: str) -> None:
    answer = client.post("/targets", json=TRANSFORMERS | change)
    assert answer.status_code == 422
    assert message in answer.json()["detail"]
    assert client.get("/targets").json() == []


@pytest.mark.parametrize("change", [{"branches": []}, {"install_mode": "conda"}, {"commit_policy": "some"}, {"extra": 1}])
def test_schema_errors_are_422(client: TestClient, change: dict[str, object]) -> None:
    assert client.post("/targets", json=TRANSFORMERS | change).status_code == 422


def test_removing_an_unknown_target_is_404(client: TestClient) -> None:
    answer = client.delete("/targets/nothing")
    assert answer.status_code == 404
    assert "no target named 'nothing'" in answer.json()["detail"]
