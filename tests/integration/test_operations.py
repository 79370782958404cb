"""Operating specwatch (issue 26, Build 4) over HTTP on real PostgreSQL: a target's last poll and its error, its queue
and its age, its last run, in ``/targets`` and on its page; ``/metrics`` with the queue age, the outbox backlog,
poll errors, run and case durations and failures by kind; a re-run of a commit from the API and the dashboard with
its reason on the run page and the timeline; error alerts and timeline error rows with the error, the run and its log."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.auth import hash_token
from service.models import (
    Alert,
    AlertKind,
    Commit,
    Notification,
    NotificationChannel,
    NotificationStatus,
    PollKind,
    PollState,
    Run,
    RunStatus,
    Target,
)
from service.settings import Settings
from tests.support.history import BRANCH, TARGET, Seeded, seed_history

pytestmark = pytest.mark.integration

WRITE_TOKEN = "operations-write-token"
WRITE = {"Authorization": f"Bearer {WRITE_TOKEN}"}
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
POLL_ERROR = "git ls-remote failed (exit 128): could not resolve host github.invalid"
BROKEN = "the suite crashed: ImportError: cannot import name 'speculative_sample' from 'toy_lib.sampler'"
LOG = 'Traceback (most recent call last):\n  File "toy_lib/sampler.py", line 3\nImportError: cannot import name'


class RecordingProducer:
    def __init__(self) -> None:
        self.sent: list[int] = []

    def send_run(self, run_id: int) -> None:
        self.sent.append(run_id)


@pytest.fixture
def producer() -> RecordingProducer:
    return RecordingProducer()


@pytest.fixture
def seeded(rolled_back_factory: sessionmaker[Session]) -> tuple[Seeded, int, int]:
    """The seeded history, plus a failing poll, a run waiting for 10 minutes, a broken commit's run and its alert,
    and notifications: one due, one deferred, one given up. Yields (seeded, broken run id, broken alert id)."""
    now = datetime.now(UTC)
    with rolled_back_factory() as session:
        made = seed_history(session)
        target = session.scalars(select(Target).where(Target.name == TARGET)).one()
        session.add(
            PollState(target_id=target.id, kind=PollKind.branch, ref=BRANCH, polled_at=now - timedelta(minutes=2), error=POLL_ERROR)
        )
        queued = session.get(Run, made.runs[7])
        assert queued is not None
        queued.queued_at = now - timedelta(minutes=10)
        commit = session.scalars(select(Commit).where(Commit.sha == made.shas[8])).one()
        broken = Run(
            commit=commit,
            profile="default",
            status=RunStatus.error,
            error=BROKEN,
            log_tail=LOG,
            started_at=now - timedelta(seconds=95),
            finished_at=now - timedelta(seconds=5),
        )
        session.add(broken)
        session.flush()
        alert = Alert(
            target_id=target.id,
            branch=BRANCH,
            first_bad_commit_id=commit.id,
            kind=AlertKind.broken,
            detected_run_id=broken.id,
            cases=[{"case_id": "(suite)", "reason": "broken", "error": BROKEN}],
            summary="the commit does not run",
        )
        session.add(alert)
        for index, (status, next_at) in enumerate(
            [
                (NotificationStatus.pending, None),
                (NotificationStatus.pending, now + timedelta(minutes=5)),
                (NotificationStatus.failed, None),
            ]
        ):
            session.add(
                Notification(
                    dedup_key=f"ops-test-{index}",
                    channel=NotificationChannel.slack,
                    event="opened",
                    payload={},
                    status=status,
                    next_attempt_at=next_at,
                    created_at=now - timedelta(minutes=30 - index),
                )
            )
        session.flush()
        ids = (broken.id, alert.id)
        session.commit()
    return made, *ids


@pytest.fixture
def client(rolled_back_factory: sessionmaker[Session], producer: RecordingProducer) -> Iterator[TestClient]:
    settings = Settings(
        env="test",
        database_url="postgresql+psycopg://unused",
        webhook_secret=SecretStr("x"),
        api_token_hashes=[hash_token(WRITE_TOKEN)],
        session_secret=SecretStr("an-operations-session-secret"),
    )
    with TestClient(create_app(settings, session_factory=rolled_back_factory, producer=producer)) as made:
        yield made


def test_targets_show_the_last_poll_and_its_error_the_queue_and_the_last_run(client: TestClient, seeded: tuple[Seeded, int, int]) -> None:
    made, broken_run, _ = seeded
    (listed,) = client.get("/targets").json()
    assert listed["poll_errors"] == {f"branch:{BRANCH}": POLL_ERROR}
    [poll] = listed["polls"]
    assert (poll["kind"], poll["ref"], poll["error"], poll["succeeded_at"]) == ("branch", BRANCH, POLL_ERROR, None)
    assert listed["last_polled_at"] is not None
    assert (listed["queued_runs"], listed["running_runs"]) == (1, 0)
    assert 590 <= listed["queue_age_s"] < 3600
    assert listed["last_run"]["id"] == broken_run
    assert (listed["last_run"]["status"], listed["last_run"]["error"]) == ("error", BROKEN)

    page = client.get(f"/ui/targets/{TARGET}").text
    assert f'<span class="poll-error failed">{POLL_ERROR}</span>' in page
    assert "queue: 1 run(s) waiting, the oldest since" in page
    assert f'last run: <a href="/ui/runs/{broken_run}">run {broken_run}</a>' in page
    assert f'(<a href="/ui/runs/{broken_run}#log">log</a>)' in page
    assert made.shas[8][:12] in page


def test_an_error_row_and_an_error_alert_show_the_error_and_link_the_run_and_its_log(
    client: TestClient, seeded: tuple[Seeded, int, int]
) -> None:
    _, broken_run, alert_id = seeded
    timeline = client.get(f"/ui/targets/{TARGET}").text
    row = re.search(r'<tr id="[0-9a-f]+" class="commit" data-sha="[0-9a-f]+" data-status="error".*?</tr>', timeline, re.S)
    assert row is not None
    assert BROKEN.replace("'", "&#39;") in row[0]
    assert f'<a href="/ui/runs/{broken_run}#log">log</a>' in row[0]

    alert = client.get(f"/ui/alerts/{alert_id}").text
    assert '<td id="alert-error">' in alert
    assert BROKEN.replace("'", "&#39;") in alert
    assert f'<a href="/ui/runs/{broken_run}#log">its log</a>' in alert
    run = client.get(f"/ui/runs/{broken_run}").text
    assert '<h2 id="log">Log</h2>' in run
    assert "ImportError: cannot import name" in run

    log = client.get(f"/runs/{broken_run}/log")
    assert log.status_code == 200
    assert log.headers["content-type"].startswith("text/plain")
    assert f"error: {BROKEN}" in log.text
    assert LOG in log.text
    assert client.get("/runs/999999/log").status_code == 404


def test_metrics_show_queue_age_outbox_backlog_poll_errors_durations_and_failures(
    client: TestClient, seeded: tuple[Seeded, int, int]
) -> None:
    text = client.get("/metrics").text

    def value(series: str) -> float:
        found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
        assert found is not None, series
        return float(found[1])

    assert 590 <= value(f'specwatch_queue_oldest_age_seconds{{target="{TARGET}"}}') < 3600
    assert value(f'specwatch_target_runs_waiting{{status="queued",target="{TARGET}"}}') == 1
    assert value('specwatch_outbox_backlog{channel="slack",state="due"}') == 1
    assert value('specwatch_outbox_backlog{channel="slack",state="deferred"}') == 1
    assert value('specwatch_outbox_backlog{channel="slack",state="given_up"}') == 1
    assert 29 * 60 <= value("specwatch_outbox_oldest_age_seconds") < 3600
    assert value(f'specwatch_poll_failing{{kind="branch",ref="{BRANCH}",target="{TARGET}"}}') == 1
    assert value(f'specwatch_poll_errors{{target="{TARGET}"}}') == 1
    # The broken run took 90 s: in the 120 s bucket, not the 60 s one.
    assert value('specwatch_run_duration_seconds_bucket{le="60.0",status="error"}') == 0
    assert value('specwatch_run_duration_seconds_bucket{le="120.0",status="error"}') == 1
    assert 89 <= value('specwatch_run_duration_seconds_sum{status="error"}') <= 91
    # 6 finished runs of 3 cases, 1.5 s each.
    assert value("specwatch_case_duration_seconds_count") == 18
    assert value('specwatch_case_duration_seconds_bucket{le="1.0"}') == 0
    assert value('specwatch_case_duration_seconds_bucket{le="2.0"}') == 18
    assert value('specwatch_run_failures{kind="violation"}') == 2
    assert value('specwatch_run_failures{kind="broken"}') == 2  # the broken run, and commit 4's lost worker
    assert value('specwatch_case_failures{kind="lossless"}') == 2


def test_a_rerun_from_the_api_records_its_reason_and_is_sent_after_commit(
    client: TestClient, seeded: tuple[Seeded, int, int], producer: RecordingProducer, rolled_back_factory: sessionmaker[Session]
) -> None:
    made, _, _ = seeded
    sha = made.shas[5]
    url = f"/targets/{TARGET}/commits/{sha[:10]}/rerun"
    assert client.post(url, json={"reason": "worker upgraded"}).status_code == 401
    answer = client.post(url, json={"reason": "  worker\nupgraded to torch 2.13 "}, headers=WRITE)
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert (body["sha"], body["reason"], body["requested_by"]) == (sha, "worker upgraded to torch 2.13", "api")
    assert producer.sent == [body["run_id"]]
    with rolled_back_factory() as session:
        run = session.get(Run, body["run_id"])
        assert run is not None
        assert (run.status, run.purpose.value, run.seed_attempt, run.rerun_reason) == (
            RunStatus.queued,
            "primary",
            0,
            "worker upgraded to torch 2.13",
        )
    again = client.post(url, json={"reason": "twice"}, headers=WRITE)
    assert again.status_code == 409
    assert "still queued or running" in again.json()["detail"]
    assert client.post(url, json={"reason": "   "}, headers=WRITE).status_code == 400
    assert client.post(url, json={}, headers=WRITE).status_code == 422
    assert client.post(f"/targets/{TARGET}/commits/feedbeef/rerun", json={"reason": "x"}, headers=WRITE).status_code == 404
    assert producer.sent == [body["run_id"]]

    timeline = client.get(f"/ui/targets/{TARGET}").text
    assert "re-run by api: worker upgraded to torch 2.13" in timeline
    assert client.get(f"/runs/{body['run_id']}").json()["rerun_reason"] == "worker upgraded to torch 2.13"
    assert "asked by api: worker upgraded to torch 2.13" in client.get(f"/ui/runs/{body['run_id']}").text


def test_a_rerun_from_the_dashboard_button(client: TestClient, seeded: tuple[Seeded, int, int], producer: RecordingProducer) -> None:
    made, broken_run, _ = seeded
    page = client.get(f"/ui/runs/{broken_run}").text
    assert 'id="rerun"' not in page  # not signed in: no button, but the way to sign in and the command
    assert f"specwatch rerun {TARGET} {made.shas[8][:12]}" in page
    login = client.get("/ui/login")
    csrf = CSRF.search(login.text)
    assert csrf is not None
    signed = client.post("/ui/login", data={"token": WRITE_TOKEN, "csrf": csrf[1], "next": f"/ui/runs/{broken_run}"}, follow_redirects=True)
    assert 'id="rerun"' in signed.text
    form_csrf = CSRF.search(signed.text.split('id="rerun"')[1])
    assert form_csrf is not None
    action = f"/ui/targets/{TARGET}/commits/{made.shas[8]}/rerun"
    refused = client.post(action, data={"csrf": "forged", "reason": "sandbox fixed"})
    assert refused.status_code == 403
    answer = client.post(action, data={"csrf": form_csrf[1], "reason": "sandbox fixed"}, follow_redirects=False)
    assert answer.status_code == 303
    assert producer.sent
    assert answer.headers["location"] == f"/ui/runs/{producer.sent[-1]}"
    assert "asked by dashboard: sandbox fixed" in client.get(answer.headers["location"]).text
