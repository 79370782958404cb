"""Configuration errors are the target's (issue 26): a wrong repository makes one target alert, not one per commit.

The issue's storm: with ``--policy every``, a repository URL that does not exist gave six "broken commit" alerts
and six "Resolved:" messages. Here three commits of a real git repository are queued under a repository path
that does not exist; each run is the real worker task (its checkout fails) and its real analysis. Then the
target is pointed at the right repository and its head runs again: the one alert resolves. Slack is configured
(the outbox rows are checked); ``GET /targets`` and the target page show the cause while it lasts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.auth import hash_token
from service.db import session_scope
from service.models import Alert, AlertKind, AlertState, Notification, Run, RunStatus, Target
from service.settings import Settings
from tests.support.toy_target import ADAPTER, CORRECT, ToyRepo
from tests.support.workers import REDIS_URL, WEBHOOK_SECRET, add_runs, clear_caches

# The module, not its tasks (see test_tasks.py).
from workers import tasks

pytestmark = pytest.mark.usefixtures("worker_env")

TOKEN = "configuration-test-token"
WRITE = {"Authorization": f"Bearer {TOKEN}"}


class NoProducer:
    def send_run(self, run_id: int) -> None:
        raise AssertionError(f"nothing should be enqueued (run {run_id})")


@pytest.fixture
def client(database_url: str, factory: sessionmaker[Session]) -> TestClient:
    settings = Settings(
        env="test", database_url=database_url, redis_url=REDIS_URL, webhook_secret=WEBHOOK_SECRET, api_token_hashes=[hash_token(TOKEN)]
    )
    return TestClient(create_app(settings, session_factory=factory, producer=NoProducer()))


def alerts(factory: sessionmaker[Session]) -> list[Alert]:
    with factory() as session:
        return list(session.scalars(select(Alert).order_by(Alert.id)))


def slack_events(factory: sessionmaker[Session]) -> list[tuple[str, int | None]]:
    with factory() as session:
        return [(n.event, n.alert_id) for n in session.scalars(select(Notification).where(Notification.channel == "slack"))]


def test_a_missing_repository_is_one_target_alert_resolved_when_the_target_works_again(
    factory: sessionmaker[Session], toy_repo: ToyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: TestClient
) -> None:
    monkeypatch.setenv("SPECWATCH_SLACK_WEBHOOK_URL", "http://127.0.0.1:9/never-called")
    clear_caches()
    shas = [toy_repo.commit(CORRECT.replace("vectorised", f"vectorised ({i})", 1), f"commit {i}") for i in range(3)]
    missing = str(tmp_path / "no-such-repository")
    run_ids = add_runs(factory, missing, shas, adapter=ADAPTER)

    for run_id in run_ids:
        assert tasks.run_suite(run_id)["status"] == "error"
        assert tasks.analyse_run(run_id)["kind"] == "configuration"

    (alert,) = alerts(factory)
    assert (alert.kind, alert.state) == (AlertKind.configuration, AlertState.open)
    assert "git clone failed (exit 128): repository not found" in alert.cases[0]["error"]
    assert alert.summary is not None
    assert alert.summary.startswith("configuration error of ")
    assert slack_events(factory) == [("opened", alert.id)]
    with factory() as session:
        assert all(session.get_one(Run, run_id).configuration_error for run_id in run_ids)
        name = session.scalars(select(Target.name)).one()
    (listed,) = client.get("/targets").json()
    assert listed["configuration_error"] == alert.cases[0]["error"]
    assert listed["configuration_alert_id"] == alert.id
    page = client.get(f"/ui/targets/{name}")
    assert page.status_code == 200
    assert 'id="configuration-error"' in page.text
    assert "repository not found" in page.text

    with session_scope(factory) as session:  # the target is pointed at the right repository; its head runs again
        target = session.scalars(select(Target)).one()
        target.repo_url = toy_repo.url
        head = session.get_one(Run, run_ids[-1]).commit
        again = Run(commit=head, profile="smoke", status=RunStatus.queued)
        session.add(again)
        session.flush()
        again_id = again.id
    assert tasks.run_suite(again_id)["status"] == "passed"
    tasks.analyse_run(again_id)

    (alert,) = alerts(factory)
    assert alert.state is AlertState.resolved
    assert slack_events(factory) == [("opened", alert.id), ("resolved", alert.id)]
    assert client.get("/targets").json()[0]["configuration_error"] is None


@pytest.mark.parametrize(
    ("where", "says"),
    [("no-such-dir/repo", "does not exist"), ("plain-dir", "is not a git repository")],
)
def test_adding_a_local_repository_that_is_not_there_is_refused_before_saving(
    client: TestClient, tmp_path: Path, where: str, says: str
) -> None:
    (tmp_path / "plain-dir").mkdir()
    body = {"name": "mylib", "repo_url": str(tmp_path / where), "branches": ["main"], "adapter": ADAPTER}

    answer = client.post("/targets", json=body, headers=WRITE)

    assert answer.status_code == 422
    assert says in answer.json()["detail"]
    assert client.get("/targets").json() == []
