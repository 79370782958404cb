"""Issue 26's known finding, fixed and then back, all real: signed pushes to the app served by uvicorn, ``specwatch
worker`` running the suite on a mirror of a real git repository, PostgreSQL and Redis.

The toy sampler on ``main``: correct (A), the swapped residual (B), a revert of B (C), then one push of a
harmless commit (D) and the bug again (E). Before B is pushed, a maintainer records B's bug as a known finding
(every case, from B on, open). B fails: known, so nobody is paged. C passes: the finding is seen fixed there and
Slack is told. E fails: a regression of the fixed finding, confirmed, bisected between C and E (D is tested) and
alerted as a regression.

Before the lifecycle, B opened a violation alert (known findings changed no decision), C only resolved it, and E,
inside the finding's open range, merged into nothing new that said the finding was back.

The target opted in to GitHub check runs: a local server speaking GitHub's API (refusing what GitHub would) gets
B's check run, whose report marks its failures known and links the finding's page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.models import Alert, AlertKind, AlertState, FindingState, KnownFinding, Notification, Run, RunPurpose
from tests.e2e.conftest import WRITE, WorkerProcess, app_settings, served, wait_for
from tests.e2e.test_regression_lifecycle import commit_ids, settled
from tests.support.github import REPO_URL, ZERO_SHA, post_webhook, push_payload
from tests.support.http_fakes import FakeServer, fake_server
from tests.support.toy_target import ADAPTER, CORRECT, SWAPPED_RESIDUAL, ToyRepo, git
from tests.support.workers import REDIS_URL, WEBHOOK_SECRET

# A worker start and six suite runs: about a minute.
pytestmark = pytest.mark.slow

TARGET = {"name": "mylib3", "repo_url": REPO_URL, "branches": ["main"], "adapter": ADAPTER, "commit_policy": "head", "github_checks": True}


def check_runs(github: FakeServer, sha: str) -> list[dict[str, object]]:
    return [r.body for r in list(github.requests) if r.path.endswith("/check-runs") and r.body["head_sha"] == sha]


@pytest.fixture
def github() -> Iterator[FakeServer]:
    """GitHub's API on 127.0.0.1 (set up before the worker, so it outlives it)."""
    with fake_server([(201, {})], check_github_checks=True) as server:
        yield server


def test_a_known_finding_fixed_and_then_back_is_a_regression(
    github: FakeServer,
    database_url: str,
    factory: sessionmaker[Session],
    toy_repo: ToyRepo,
    start_service_worker: Callable[..., WorkerProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = toy_repo.commit(CORRECT, "Add speculative sampling")
    bad = toy_repo.commit(SWAPPED_RESIDUAL, "Simplify the residual")
    git(toy_repo.path, "revert", "--no-edit", "HEAD")
    revert = git(toy_repo.path, "rev-parse", "HEAD")
    harmless = toy_repo.commit(CORRECT.replace('"""Speculative sampling', '"""Speculative sampling, reworded:', 1), "Reword")
    again = toy_repo.commit(SWAPPED_RESIDUAL, "Simplify the residual, again")
    monkeypatch.setenv("SPECWATCH_SLACK_WEBHOOK_URL", "http://127.0.0.1:9/never-called")  # the outbox rows are checked
    monkeypatch.setenv("SPECWATCH_GITHUB_TOKEN", "ghs_e2e-installation-token")
    monkeypatch.setenv("SPECWATCH_GITHUB_API_URL", github.url)
    worker = start_service_worker("gpu-1")

    def push(before: str, after: str, runs_at_least: int) -> None:
        answer = post_webhook(client, WEBHOOK_SECRET, "push", push_payload(toy_repo.path, before, after))
        assert answer.status_code == 202, answer.text
        wait_for(lambda: settled(factory, runs_at_least) or worker.proc.poll() is not None, timeout=240, what="runs", logs=worker.output)
        assert worker.proc.poll() is None, worker.output()

    finding = {"key": "swapped-residual", "title": "The residual is swapped", "cases": ["*"], "link": "https://example.org/issues/1"}
    with served(create_app(app_settings(database_url, REDIS_URL))) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/targets", json=TARGET, headers=WRITE).status_code == 201
        answer = client.post("/targets/mylib3/findings", json=finding | {"commit_from": bad}, headers=WRITE)
        assert answer.status_code == 201, answer.text
        push(ZERO_SHA, good, 1)
        push(good, bad, 2)  # known: no confirmation run, no alert
        wait_for(lambda: bool(check_runs(github, bad)), timeout=120, what="B's check run", logs=worker.output)
        (check,) = check_runs(github, bad)
        output = check["output"]
        assert (check["conclusion"], check["name"]) == ("failure", "specwatch/smoke")
        assert isinstance(output, dict)
        assert "of them known finding" in output["title"]
        page = "/ui/targets/mylib3/findings#finding-swapped-residual"
        assert "known: [The residual is swapped](" in output["text"]
        assert page in output["text"]
        assert f"specwatch check --target {ADAPTER} --source checkout --seed" in output["text"]
        with factory() as session:
            assert session.scalars(select(Alert)).all() == []
            assert session.scalars(select(Run.status).where(Run.commit.has(sha=bad))).all() == ["failed"]
        push(bad, revert, 3)
        seen = client.get("/targets/mylib3/findings/swapped-residual").json()
        assert (seen["state"], seen["fixed_commit"], seen["fixed_in"]) == ("fixed", revert, f"{revert[:12]} (seen passing by specwatch)")
        push(revert, again, 6)  # one push of D and E: E, its confirmation, then D by the search
        (alert,) = client.get("/alerts").json()
        cases = {entry["case_id"] for entry in alert["cases"]}
        assert cases
        assert set(alert["regressions"]) == cases  # every case of the alert brings the finding back
        assert {link["key"] for link in alert["regressions"].values()} == {"swapped-residual"}

    ids = commit_ids(factory)
    with factory() as session:
        (alert_row,) = session.scalars(select(Alert)).all()
        assert (alert_row.kind, alert_row.state, alert_row.confirmed) == (AlertKind.violation, AlertState.open, True)
        assert (alert_row.first_bad_commit_id, alert_row.last_good_commit_id) == (ids[again], ids[harmless])
        (midpoint,) = session.scalars(select(Run).where(Run.purpose == RunPurpose.bisection)).all()
        assert midpoint.commit_id == ids[harmless]
        (row,) = session.scalars(select(KnownFinding)).all()
        assert (row.state, row.fixed_commit_id) == (FindingState.fixed, ids[revert])
        slack = session.execute(
            select(Notification.event, Notification.payload).where(Notification.channel == "slack").order_by(Notification.id)
        )
        events = [(event, payload["text"]) for event, payload in slack]
        assert [event for event, _ in events] == ["finding-fixed", "opened"]
        assert f"fixed in {revert[:12]}" in events[0][1]
        assert events[1][1].startswith("Regression of a fixed known finding")
