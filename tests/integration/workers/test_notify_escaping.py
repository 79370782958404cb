"""Library-provided text in Slack messages and GitHub statuses (issue 28, item 3): made literal and short.

The error text of exception, broken and uninstallable alerts, a case's id and reason come from the run's
result file or its error, written beside the code under test. Each alert kind here carries ``<!channel>`` and
a disguised link in every such field; the message is queued and sent to a stand-in Slack that checks Block
Kit's limits, and what arrived is read back.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.models import Alert, AlertKind, Commit, Notification, Run, RunStatus, Target
from service.notifications.github import queue_commit_status
from service.notifications.outbox import NotifyConfig
from service.notifications.slack import queue_alert_message
from service.notifications.statuses import GITHUB_DESCRIPTION_MAX, STATUSES
from service.notifications.text import CUT_MARKER, TEXT_MAX
from tests.support.http_fakes import block_kit_problems, fake_server
from workers.notify import deliver_due
from workers.senders import Channels

HOSTILE = "<!channel> urgent: see <https://evil.example/login|the specwatch dashboard> & <@U123>"
SLACK_PATH = "/services/T000/B000/escape"


def _entries(kind: AlertKind) -> list[dict[str, Any]]:
    if kind is AlertKind.broken:
        return [{"case_id": "(suite)", "reason": "broken", "error": HOSTILE}]
    if kind is AlertKind.uninstallable:
        return [{"case_id": "(install)", "reason": "uninstallable", "requirement": "<!here>", "error": HOSTILE}]
    if kind is AlertKind.exception:
        return [{"case_id": f"direct/{HOSTILE}", "reason": "raised", "error": HOSTILE}]
    # A case id is the suite's, but the result file is written beside the code under test: it can be anything.
    # (An entry's figures are numbers: a stored entry with text there is refused on read, see alert_entries.)
    figures = dict.fromkeys(("e_value", "log_e_value", "tv_estimate", "acceptance_observed", "acceptance_expected", "n_trials"))
    return [{"case_id": f"direct/{HOSTILE}", "reason": "lossless", "threshold": 1e5, **figures}]


def _texts(value: object) -> list[str]:
    """Every string of a Block Kit payload that Slack parses: all but ``plain_text`` objects (the header)."""
    if isinstance(value, dict):
        if value.get("type") == "plain_text":
            return []
        return [text for item in value.values() for text in _texts(item)]
    if isinstance(value, list):
        return [text for item in value for text in _texts(item)]
    return [value] if isinstance(value, str) else []


def _deliver(factory: sessionmaker[Session], alert_values: dict[str, Any]) -> dict[str, Any]:
    with fake_server([(200, {})], check_block_kit=True) as slack:
        channels = Channels(slack_webhook_url=slack.url + SLACK_PATH, github_token=None)
        with session_scope(factory) as session:
            target = Target(name="lib <!here>", repo_url="https://github.com/acme/lib", adapter="x", branches=["main"])
            commit = Commit(target=target, sha="e" * 40, branch="main", branch_order=1)
            alert = Alert(target=target, branch="main", first_bad_commit=commit, confirmed=True, **alert_values)
            session.add(alert)
            session.flush()
            assert queue_alert_message(session, NotifyConfig(slack=True), alert, "opened") == 1
        report = deliver_due(factory, channels, now=lambda: datetime(2026, 1, 1, tzinfo=UTC), limit=5)
        assert len(report.sent) == 1, report
        (request,) = slack.requests
    assert block_kit_problems(request.body) == []
    return dict(request.body)


@pytest.mark.parametrize("kind", list(AlertKind))
def test_library_text_reaches_slack_as_literal_text(backend_factory: sessionmaker[Session], kind: AlertKind) -> None:
    body = _deliver(backend_factory, {"kind": kind, "cases": _entries(kind), "summary": f"summary {HOSTILE}"})
    texts = _texts(body)
    joined = "\n".join(texts)
    assert "<!channel>" not in joined
    assert "<!here>" not in joined
    assert "<@U123>" not in joined
    assert "<https://evil.example" not in joined  # no link at all to it: the label cannot disguise it
    assert "&lt;!channel&gt;" in joined  # shown, as text
    # Our own links still are links, and every mrkdwn object is verbatim (no auto-linking, no @mentions).
    assert re.search(r"<http://127\.0\.0\.1:8000/ui/alerts/\d+\|Open on the dashboard>", joined)
    mrkdwn_objects = [b["text"] for b in body["blocks"] if isinstance(b.get("text"), dict) and b["text"]["type"] == "mrkdwn"]
    assert mrkdwn_objects
    assert all(o.get("verbatim") is True for o in mrkdwn_objects)


def test_a_megabyte_error_is_cut_with_a_marker(backend_factory: sessionmaker[Session]) -> None:
    error = "<" * 1_000_000
    body = _deliver(backend_factory, {"kind": AlertKind.exception, "cases": [{"case_id": "c", "reason": "exception", "error": error}]})
    (line,) = [t for t in _texts(body) if "sampler raised" in t]
    assert CUT_MARKER in line
    assert line.count("&lt;") == TEXT_MAX - len(CUT_MARKER)
    assert len(str(body)) < 10_000


def test_a_commit_status_description_is_at_most_140_characters(
    backend_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a status says (here a longer sentence than any today), GitHub gets at most 140 characters."""
    monkeypatch.setitem(STATUSES, "confirming", ("pending", "run failed; " + "confirming " * 20))
    with session_scope(backend_factory) as session:
        target = Target(name="lib", repo_url="https://github.com/acme/lib", adapter="x", branches=["main"])
        run = Run(commit=Commit(target=target, sha="f" * 40, branch="main", branch_order=1), profile="p" * 50, status=RunStatus.failed)
        session.add(run)
        session.flush()
        config = NotifyConfig(github=True)
        for status in ("pending", "confirming", "unconfirmable", "not-confirmed"):
            assert queue_commit_status(session, config, run, status) == 1
        descriptions = [n.payload["description"] for n in session.query(Notification).filter(Notification.run_id == run.id)]
    assert len(descriptions) == 4
    assert all(len(d) <= GITHUB_DESCRIPTION_MAX for d in descriptions)
    (long,) = [d for d in descriptions if "confirming" in d]
    assert len(long) == GITHUB_DESCRIPTION_MAX
    assert long.endswith(CUT_MARKER)
