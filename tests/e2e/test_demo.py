"""The laptop path as a newcomer runs it (docs/getting-started.md): `specwatch serve`, then `specwatch demo` against it.

The demo creates its own repository, registers it through the API, posts a signed push and follows the
runs through `GET /runs/{id}` until they finish: the correct commit passes, the buggy one fails.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.models import Alert, Notification, NotificationChannel, NotificationStatus, Run, RunStatus
from tests.e2e.conftest import wait_for
from tests.e2e.test_serve import API_TOKEN, SECRET, SPECWATCH, sqlite_factory, sqlite_url, start_serve  # noqa: F401 - fixtures
from tests.support.http_fakes import fake_server

pytestmark = pytest.mark.slow


def run_demo(served, tmp_path: Path) -> str:
    command = [SPECWATCH, "demo", "--url", served.url, "--secret", SECRET, "--token", API_TOKEN]
    command += ["--workdir", str(tmp_path / "demo"), "--timeout", "300"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=360, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n--- serve ---\n{served.output()[-3000:]}"
    return done.stdout


def test_the_demo_push_produces_completed_runs_visible_through_the_api(start_serve, tmp_path):  # noqa: F811
    output = run_demo(start_serve(), tmp_path)
    assert "passed" in output
    assert "failed" in output


def settled(factory: sessionmaker[Session]) -> bool:
    """Every run finished and analysed, an alert recorded, and no Slack message still waiting to be sent."""
    with factory() as session:
        runs = list(session.scalars(select(Run)))
        alerts = list(session.scalars(select(Alert)))
        slack = list(session.scalars(select(Notification).where(Notification.channel == NotificationChannel.slack)))
    return (
        bool(runs)
        and all(run.status not in (RunStatus.queued, RunStatus.running) and run.analysed_at is not None for run in runs)
        and bool(alerts)
        and all(row.status != NotificationStatus.pending for row in slack)
    )


def test_the_demo_failure_is_posted_to_slack_once_on_the_embedded_default(start_serve, sqlite_factory, tmp_path):  # noqa: F811
    """The README's embedded setup with Slack configured: the demo's buggy commit is confirmed by a rerun, and
    the alert reaches a local Slack-protocol server exactly once (this never happened on SQLite before)."""
    with fake_server([(200, {})], check_block_kit=True) as slack:
        served = start_serve(SPECWATCH_SLACK_WEBHOOK_URL=f"{slack.url}/services/T000/B000/embedded")
        run_demo(served, tmp_path)
        wait_for(lambda: settled(sqlite_factory), timeout=180, what="the alert and its Slack message", logs=served.output)
        requests = list(slack.requests)

    with sqlite_factory() as session:
        (alert,) = session.scalars(select(Alert))
        (message,) = session.scalars(select(Notification).where(Notification.channel == NotificationChannel.slack))
        confirmations = [run for run in session.scalars(select(Run)) if run.purpose.value == "confirmation"]
    assert alert.confirmed
    assert alert.kind.value == "violation"
    assert confirmations, "the failure was alerted without a confirmation run"
    assert message.status == NotificationStatus.sent
    assert len(requests) == 1, [request.body for request in requests]
    assert requests[0].path == "/services/T000/B000/embedded"
    assert requests[0].status == 200
    assert "violation" in requests[0].body["text"].lower()
    assert "unknown function" not in served.output()
