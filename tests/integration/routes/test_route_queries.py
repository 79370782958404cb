"""The read API on real PostgreSQL over a seeded history: commits (pagination), runs, case history, compare,
auth on reads and writes, /readyz and /metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.auth import hash_token
from service.models import RELEASES_BRANCH, Commit, InstallMode, Run, RunStatus, Target
from service.releases import release_sha
from service.settings import Settings
from tests.support.history import CASES, FAILING_CASE, FIRST_FAILING, TARGET, Seeded, case_result, seed_history
from tests.support.redis_databases import redis_url

pytestmark = pytest.mark.integration

WRITE_TOKEN, READ_TOKEN = "write-token-for-tests", "read-token-for-tests"
WRITE = {"Authorization": f"Bearer {WRITE_TOKEN}"}
READ = {"Authorization": f"Bearer {READ_TOKEN}"}
REDIS_URL = redis_url("routes")  # this test process's own database (tests/support/redis_databases.py)


class NoProducer:
    def send_run(self, run_id: int) -> None:
        raise AssertionError(f"nothing should be enqueued (run {run_id})")


def make_settings(**changes: Any) -> Settings:
    values: dict[str, Any] = {
        "env": "test",
        "database_url": "postgresql+psycopg://unused",
        "redis_url": REDIS_URL,
        "webhook_secret": SecretStr("x"),
        "api_token_hashes": [hash_token(WRITE_TOKEN)],
        "api_read_token_hashes": [hash_token(READ_TOKEN)],
    }
    return Settings(**(values | changes))


@pytest.fixture
def seeded(rolled_back_factory: sessionmaker[Session]) -> Seeded:
    with rolled_back_factory() as session:
        made = seed_history(session)
        session.commit()
    return made


@pytest.fixture
def make_client(rolled_back_factory: sessionmaker[Session]) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(**changes: Any) -> TestClient:
        client = TestClient(create_app(make_settings(**changes), session_factory=rolled_back_factory, producer=NoProducer()))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient], seeded: Seeded) -> TestClient:
    return make_client()


# --- commits -----------------------------------------------------------------------------------------------


def test_commits_newest_first_with_latest_run_status(client: TestClient, seeded: Seeded) -> None:
    page = client.get(f"/targets/{TARGET}/commits").json()
    assert page["branch"] == "main"
    assert [c["branch_order"] for c in page["commits"]] == [8, 7, 6, 5, 4, 3, 2, 1]
    statuses = {c["branch_order"]: c["status"] for c in page["commits"]}
    assert statuses == {8: None, 7: "queued", 6: "passed", 5: "failed", 4: "failed", 3: "passed", 2: "passed", 1: "passed"}
    by_order = {c["branch_order"]: c for c in page["commits"]}
    # Commit 4 was run twice: its latest run stands for it.
    assert by_order[4]["run_id"] == seeded.runs[4] != seeded.older_run
    assert [c["branch_order"] for c in page["commits"] if c["first_failing"]] == [FIRST_FAILING]
    assert by_order[5]["failed_cases"] == 1
    assert page["next_cursor"] is None


def test_commits_pagination_walks_every_commit_once(client: TestClient, seeded: Seeded) -> None:
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = client.get(f"/targets/{TARGET}/commits", params=params).json()
        seen += [c["branch_order"] for c in page["commits"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [8, 7, 6, 5, 4, 3, 2, 1]
    assert pages == 3
    # The first failing commit is marked even when its predecessor is on the next page.
    page = client.get(f"/targets/{TARGET}/commits", params={"limit": 4, "cursor": "8"}).json()
    assert [(c["branch_order"], c["first_failing"]) for c in page["commits"]] == [(7, False), (6, False), (5, False), (4, True)]


def test_commits_last_and_empty_pages(client: TestClient, seeded: Seeded) -> None:
    last = client.get(f"/targets/{TARGET}/commits", params={"limit": 8}).json()
    assert len(last["commits"]) == 8
    assert last["next_cursor"] is None
    empty = client.get(f"/targets/{TARGET}/commits", params={"cursor": "1"}).json()
    assert empty["commits"] == []
    assert empty["next_cursor"] is None


@pytest.mark.parametrize("cursor", ["abc", "-1", "1.5", "9" * 40])
def test_a_bad_cursor_is_400(client: TestClient, cursor: str) -> None:
    answer = client.get(f"/targets/{TARGET}/commits", params={"cursor": cursor})
    assert answer.status_code == 400
    assert "invalid cursor" in answer.json()["detail"]


@pytest.mark.parametrize("limit", [0, 501])
def test_a_bad_limit_is_422(client: TestClient, limit: int) -> None:
    assert client.get(f"/targets/{TARGET}/commits", params={"limit": limit}).status_code == 422


def test_commits_of_unknown_target_or_branch_are_404(client: TestClient) -> None:
    assert client.get("/targets/nope/commits").status_code == 404
    answer = client.get(f"/targets/{TARGET}/commits", params={"branch": "nope"})
    assert answer.status_code == 404
    assert "no branch" in answer.json()["detail"]


# --- runs --------------------------------------------------------------------------------------------------


def test_run_detail_has_every_case(client: TestClient, seeded: Seeded) -> None:
    run = client.get(f"/runs/{seeded.runs[5]}").json()
    assert (run["target"], run["sha"], run["status"], run["branch_order"]) == (TARGET, seeded.shas[5], "failed", 5)
    assert [c["case_id"] for c in run["cases"]] == sorted(CASES)
    verdicts = {c["case_id"]: c["verdict"] for c in run["cases"]}
    assert verdicts[FAILING_CASE] == "fail"
    assert {v for k, v in verdicts.items() if k != FAILING_CASE} == {"pass"}
    # Fingerprints against the previous tested commit (4): the failing case's bug output is the same as on 4.
    assert (run["purpose"], run["previous_run_id"]) == ("primary", seeded.runs[4])
    assert {c["case_id"]: c["same_as_previous"] for c in run["cases"]} == dict.fromkeys(CASES, True)


def test_run_detail_marks_changed_behaviour(client: TestClient, seeded: Seeded) -> None:
    fix = client.get(f"/runs/{seeded.runs[6]}").json()
    assert fix["previous_run_id"] == seeded.runs[5]
    # 6 fixes the failing case and changes the third case's fingerprint; the second one is unchanged.
    assert {c["case_id"]: c["same_as_previous"] for c in fix["cases"]} == {CASES[0]: False, CASES[1]: True, CASES[2]: False}
    first = client.get(f"/runs/{seeded.runs[1]}").json()
    assert first["previous_run_id"] is None
    assert {c["same_as_previous"] for c in first["cases"]} == {None}


def test_unknown_run_is_404(client: TestClient) -> None:
    assert client.get("/runs/999999999").status_code == 404
    assert client.get("/runs/x").status_code == 422


# --- case history ------------------------------------------------------------------------------------------


def test_case_history_is_a_series_over_commits(client: TestClient, seeded: Seeded) -> None:
    answer = client.get(f"/targets/{TARGET}/cases/{FAILING_CASE}/history")
    assert answer.status_code == 200, answer.text
    history = answer.json()
    assert history["case_id"] == FAILING_CASE
    points = history["points"]
    assert [p["branch_order"] for p in points] == [1, 2, 3, 4, 5, 6]
    assert [p["verdict"] for p in points] == ["pass", "pass", "pass", "fail", "fail", "pass"]
    assert points[3]["run_id"] == seeded.runs[4]
    assert points[3]["log_e_value"] > 0
    assert points[3]["threshold"] == pytest.approx(3.0e4)
    assert points[3]["tv_low"] < points[3]["tv_estimate"] < points[3]["tv_high"]
    assert points[0]["acceptance_expected"] == pytest.approx(0.71)


def test_case_history_limit_keeps_the_newest(client: TestClient) -> None:
    # The newest 4 commits are 5-8; 7 (queued) and 8 (no run) have no results.
    points = client.get(f"/targets/{TARGET}/cases/{FAILING_CASE}/history", params={"limit": 4}).json()["points"]
    assert [p["branch_order"] for p in points] == [5, 6]


def test_case_history_404s(client: TestClient) -> None:
    assert client.get(f"/targets/{TARGET}/cases/no/such/case/history").status_code == 404
    assert client.get(f"/targets/nope/cases/{FAILING_CASE}/history").status_code == 404


def seed_releases(session: Session) -> None:
    """A target installed from the package index with three releases (commits on no branch), 1.1 failing."""
    target = Target(
        name="toy-pip",
        repo_url="https://github.com/octo-org/toy",
        adapter="toy_lib.sampler:speculative_sample",
        install_mode=InstallMode.pip,
    )
    session.add(target)
    session.flush()
    for order, version in enumerate(("1.0", "1.1", "1.2"), start=1):
        commit = Commit(target=target, sha=release_sha(version), branch=None, branch_order=order, message=f"toy-lib {version}")
        failing = version == "1.1"
        run = Run(commit=commit, profile="default", status=RunStatus.failed if failing else RunStatus.passed, library_version=version)
        session.add_all([commit, run])
        session.add(case_result(run, FAILING_CASE, order, failing=failing))
    session.flush()


def test_a_pip_targets_releases_are_its_history(make_client: Callable[..., TestClient], rolled_back_factory: sessionmaker[Session]) -> None:
    """Release commits are on no branch: the commits page, the case history and the overview read them as the
    target's ``(releases)`` history, the default for a target installed from the package index."""
    with rolled_back_factory() as session:
        seed_releases(session)
        session.commit()
    client = make_client()
    page = client.get("/targets/toy-pip/commits").json()
    assert page["branch"] == RELEASES_BRANCH
    assert [(c["sha"], c["status"]) for c in page["commits"]] == [
        ("release:1.2", "passed"),
        ("release:1.1", "failed"),
        ("release:1.0", "passed"),
    ]
    assert client.get("/targets/toy-pip/commits", params={"branch": RELEASES_BRANCH}).json()["commits"] == page["commits"]
    history = client.get(f"/targets/toy-pip/cases/{FAILING_CASE}/history").json()
    assert [(p["sha"], p["verdict"]) for p in history["points"]] == [
        ("release:1.0", "pass"),
        ("release:1.1", "fail"),
        ("release:1.2", "pass"),
    ]
    (toy,) = [t for t in client.get("/overview").json() if t["name"] == "toy-pip"]
    assert [(b["branch"], b["sha"], b["commits"]) for b in toy["branches"]] == [(RELEASES_BRANCH, "release:1.2", 3)]


# --- compare -----------------------------------------------------------------------------------------------


def test_compare_two_commits(client: TestClient, seeded: Seeded) -> None:
    answer = client.get("/compare", params={"target": TARGET, "a": seeded.shas[3], "b": seeded.shas[4][:10]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["sha_a"], body["sha_b"], body["run_a"], body["run_b"]) == (seeded.shas[3], seeded.shas[4], seeded.runs[3], seeded.runs[4])
    cases = {c["case_id"]: c for c in body["cases"]}
    assert set(cases) == set(CASES)
    failing = cases[FAILING_CASE]
    assert (failing["verdict_a"], failing["verdict_b"], failing["fingerprint_equal"], failing["changed"]) == ("pass", "fail", False, True)
    assert failing["acceptance_difference"] == pytest.approx(0.55 - 0.713)
    unchanged = cases[CASES[1]]
    assert (unchanged["fingerprint_equal"], unchanged["changed"]) == (True, False)


def test_compare_with_a_commit_without_results(client: TestClient, seeded: Seeded) -> None:
    body = client.get("/compare", params={"target": TARGET, "a": seeded.shas[6], "b": seeded.shas[8]}).json()
    assert body["run_b"] is None
    assert all(c["verdict_b"] is None and c["fingerprint_equal"] is None for c in body["cases"])


def test_compare_errors(client: TestClient, seeded: Seeded) -> None:
    assert client.get("/compare", params={"target": TARGET, "a": seeded.shas[3], "b": "f" * 40}).status_code == 404
    assert client.get("/compare", params={"target": "nope", "a": seeded.shas[3], "b": seeded.shas[4]}).status_code == 404
    short = client.get("/compare", params={"target": TARGET, "a": "0", "b": seeded.shas[4]})
    assert short.status_code == 400
    assert "too short" in short.json()["detail"]
    # Every seeded sha has "c0ffee" from its third character on: "0" + ... prefixes can be ambiguous.
    assert client.get("/compare", params={"target": TARGET, "b": seeded.shas[4]}).status_code == 422


def test_overview(client: TestClient, seeded: Seeded) -> None:
    (toy,) = client.get("/overview").json()
    assert toy["name"] == TARGET
    assert toy["branches"] == [{"branch": "main", "sha": seeded.shas[8], "branch_order": 8, "status": None, "commits": 8}]
    assert toy["runs_by_status"] == {"passed": 4, "failed": 2, "queued": 1, "error": 1}


# --- auth --------------------------------------------------------------------------------------------------

READS = [f"/targets/{TARGET}/commits", "/targets", "/overview", f"/targets/{TARGET}/cases/{FAILING_CASE}/history", "/alerts", "/ui"]


@pytest.mark.parametrize("path", READS)
def test_reads_are_open_by_default(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 200


@pytest.mark.parametrize("path", READS)
def test_reads_behind_a_token_when_configured(make_client: Callable[..., TestClient], seeded: Seeded, path: str) -> None:
    client = make_client(api_auth_reads=True)
    missing = client.get(path, follow_redirects=False)
    if path.startswith("/ui"):  # a browser without a session is sent to the dashboard's login page
        assert (missing.status_code, missing.headers["location"]) == (303, "/ui/login?next=%2Fui")
    else:
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == "Bearer"
    assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get(path, headers=READ).status_code == 200
    assert client.get(path, headers=WRITE).status_code == 200


def test_run_read_behind_a_token(make_client: Callable[..., TestClient], seeded: Seeded) -> None:
    client = make_client(api_auth_reads=True)
    assert client.get(f"/runs/{seeded.runs[1]}").status_code == 401
    assert client.get(f"/runs/{seeded.runs[1]}", headers=READ).status_code == 200
    assert client.get("/compare", params={"target": TARGET, "a": seeded.shas[1], "b": seeded.shas[2]}).status_code == 401


TARGET_BODY = {"name": "other", "repo_url": "https://github.com/octo-org/other", "branches": ["main"], "adapter": "transformers"}


def test_writes_always_need_a_write_token(client: TestClient) -> None:
    assert client.post("/targets", json=TARGET_BODY).status_code == 401
    assert client.post("/targets", json=TARGET_BODY, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post("/targets", json=TARGET_BODY, headers={"Authorization": "Basic abc"}).status_code == 401
    forbidden = client.post("/targets", json=TARGET_BODY, headers=READ)
    assert forbidden.status_code == 403
    assert client.delete(f"/targets/{TARGET}").status_code == 401
    assert client.delete(f"/targets/{TARGET}", headers=READ).status_code == 403
    assert [t["name"] for t in client.get("/targets").json()] == [TARGET]
    assert client.post("/targets", json=TARGET_BODY, headers=WRITE).status_code == 201
    assert client.delete("/targets/other", headers=WRITE).status_code == 204


def test_writes_are_refused_when_no_token_is_configured(make_client: Callable[..., TestClient], seeded: Seeded) -> None:
    client = make_client(api_token_hashes=[], api_read_token_hashes=[])
    assert client.post("/targets", json=TARGET_BODY, headers=WRITE).status_code == 401


# --- operations --------------------------------------------------------------------------------------------


def test_readyz_with_database_and_broker(client: TestClient) -> None:
    answer = client.get("/readyz")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"status": "ok", "database": "ok", "broker": "ok"}


def test_readyz_is_503_when_the_broker_is_down(make_client: Callable[..., TestClient]) -> None:
    answer = make_client(redis_url="redis://127.0.0.1:1/0").get("/readyz")
    assert answer.status_code == 503
    assert answer.json() == {"status": "unavailable", "database": "ok", "broker": "unreachable"}


def test_readyz_is_503_when_the_database_is_down() -> None:
    settings = make_settings(database_url="postgresql+psycopg://postgres@127.0.0.1:1/nothing?connect_timeout=2")
    with TestClient(create_app(settings, producer=NoProducer())) as client:
        answer = client.get("/readyz")
    assert answer.status_code == 503
    assert answer.json()["database"] == "unreachable"


def test_metrics(client: TestClient) -> None:
    import redis

    broker = redis.Redis.from_url(REDIS_URL)
    try:
        broker.delete("gpu", "default")
        broker.rpush("gpu", "m1", "m2")
        assert client.post("/webhooks/github", content=b"{}", headers={"X-GitHub-Event": "ping"}).status_code == 401
        text = client.get("/metrics").text
    finally:
        broker.delete("gpu", "default")
        broker.close()
    assert 'specwatch_queue_depth{queue="gpu"} 2.0' in text
    assert 'specwatch_queue_depth{queue="default"} 0.0' in text
    assert 'specwatch_runs{status="failed"} 2.0' in text
    assert 'specwatch_runs{status="cancelled"} 0.0' in text
    assert 'specwatch_webhook_latency_seconds_count{status="401"} 1.0' in text


# --- alerts ------------------------------------------------------------------------------------------------


def test_alerts_list_and_filters(client: TestClient, seeded: Seeded) -> None:
    alerts = client.get("/alerts").json()
    assert [a["id"] for a in alerts] == [seeded.resolved_alert, seeded.open_alert]
    (violation,) = client.get("/alerts", params={"state": "open"}).json()
    assert (violation["kind"], violation["first_bad_sha"], violation["last_good_sha"]) == ("violation", seeded.shas[4], seeded.shas[3])
    assert violation["cases"] == [{"case_id": FAILING_CASE, "reason": "lossless"}]
    assert [a["id"] for a in client.get("/alerts", params={"kind": "performance", "target": TARGET}).json()] == [seeded.resolved_alert]
    assert client.get("/alerts", params={"branch": "other"}).json() == []
    assert client.get("/alerts", params={"state": "bogus"}).status_code == 422
    assert client.get("/alerts", params={"target": "nope"}).status_code == 404
    assert client.get(f"/alerts/{seeded.open_alert}").json()["state"] == "open"
    assert client.get("/alerts/999999999").status_code == 404


def test_acknowledge_then_resolve(client: TestClient, seeded: Seeded) -> None:
    path = f"/alerts/{seeded.open_alert}"
    assert client.post(f"{path}/acknowledge").status_code == 401
    assert client.post(f"{path}/acknowledge", headers=READ).status_code == 403
    acked = client.post(f"{path}/acknowledge", headers=WRITE)
    assert acked.status_code == 200, acked.text
    assert acked.json()["state"] == "acknowledged"
    assert acked.json()["acknowledged_at"] is not None
    assert client.post(f"{path}/acknowledge", headers=WRITE).json()["state"] == "acknowledged"
    assert client.post(f"{path}/resolve", headers=READ).status_code == 403
    resolved = client.post(f"{path}/resolve", headers=WRITE).json()
    assert resolved["state"] == "resolved"
    assert resolved["resolved_at"] is not None
    conflict = client.post(f"{path}/acknowledge", headers=WRITE)
    assert conflict.status_code == 409
    assert "only an open alert" in conflict.json()["detail"]
    assert client.post("/alerts/999999999/resolve", headers=WRITE).status_code == 404


def test_alert_metrics(client: TestClient, seeded: Seeded) -> None:
    text = client.get("/metrics").text
    assert 'specwatch_alerts{kind="violation",state="open"} 1.0' in text
    assert 'specwatch_alerts{kind="performance",state="resolved"} 1.0' in text
    assert 'specwatch_alerts{kind="broken",state="open"} 0.0' in text
