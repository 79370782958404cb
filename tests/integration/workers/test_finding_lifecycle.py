"""Known findings have a lifecycle (issue 26, Build 2): analysis on stored runs, no suite executed.

Target ``lib`` on ``main`` with a known finding of case A from commit 2 on (open, no end): commit 1 passes;
commits 2 and 3 fail A, which the finding explains (known: no alert, nobody paged; the commit status says "known
findings only"); commit 4 passes (the finding is seen fixed there, with a "fixed" message); commit 5 passes;
commit 6 fails A again: a regression of the fixed finding, alerted as one, bisected from commit 5.

Before the lifecycle, commit 2 opened a violation alert (known findings changed no alert decision), nothing said
the finding stopped failing, and commit 6 was read as the known bug still in its open range: no alert.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.findings import add_finding
from service.models import Alert, AlertKind, CaseResult, Commit, FindingState, KnownFinding, Notification, Run, RunStatus, Verdict
from service.notifications.outbox import NotifyConfig
from service.queries import commits_page, get_alert, get_finding
from tests.support.history import branch_commits
from workers.analysis import AnalysisConfig, analyse

A, B = "direct/far_apart/V8/g1", "direct/far_apart/V8/g3"
THRESHOLD = 1e4
CONFIG = AnalysisConfig(confirm_failures=False, notify=NotifyConfig(slack=True, github=True))
NOW = datetime(2026, 1, 1, tzinfo=UTC)
KEY = "far-apart-g1"


def _run(session: Session, commit: Commit, failing: set[str], version: str | None = None) -> int:
    run = Run(commit=commit, profile="quick", status=RunStatus.failed if failing else RunStatus.passed, library_version=version)
    session.add(run)
    session.flush()
    for case_id in (A, B):
        fails = case_id in failing
        log_e = math.log(THRESHOLD) + 5.0 if fails else -1.0
        session.add(
            CaseResult(
                run_id=run.id,
                case_id=case_id,
                verdict=Verdict.FAIL if fails else Verdict.PASS,
                lossless=not fails,
                conformance=True,
                n_trials=10_000,
                e_value=math.exp(log_e),
                log_e_value=log_e,
                threshold=THRESHOLD,
            )
        )
    session.flush()
    return run.id


def _events(session: Session, **where: object) -> list[str]:
    query = select(Notification.event).order_by(Notification.id)
    for name, value in where.items():
        query = query.where(getattr(Notification, name) == value)
    return list(session.scalars(query))


def test_a_known_finding_pages_nobody_is_seen_fixed_and_its_return_is_a_regression(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib", 6)
        add_finding(
            session, "lib", {"key": KEY, "title": "A fails", "cases": [A], "link": "https://example.org/a", "commit_from": commits[1].sha}
        )
        history = [set(), {A}, {A}, set(), set(), {A}]
        runs = []
        for commit, failing in zip(commits[:5], history, strict=False):
            runs.append(_run(session, commit, failing))
            analyse(session, runs[-1], config=CONFIG, now=NOW)

        # Commits 2 and 3: known, nobody paged, the status says so; the timeline shows them known-only.
        assert session.scalars(select(Alert)).all() == []
        assert [_events(session, run_id=r) for r in runs[1:3]] == [["known"], ["known"]]
        stored = session.get_one(Run, runs[2]).analysis or {}
        assert (stored["kind"], stored["failing"], stored["known_failing"], stored["findings"]) == (None, [], [A], {KEY: [A]})
        rows = {row.sha: row for row in commits_page(session, "lib").commits}
        assert [rows[c.sha].known_only for c in commits[:5]] == [False, True, True, False, False]

        # Commit 4: seen fixed, once ("fixed in <commit>"); the finding's page says where and its last failing run.
        assert _events(session, run_id=runs[3]) == ["success", "finding-fixed"]
        assert _events(session, run_id=runs[4]) == ["success"]
        (fixed,) = session.scalars(select(Notification.payload).where(Notification.event == "finding-fixed"))
        assert f"A fails fixed in {commits[3].sha[:12]}" in fixed["text"]
        finding = get_finding(session, "lib", KEY)
        assert (finding.state, finding.fixed_commit, finding.last_failed_run_id) == (FindingState.fixed, commits[3].sha, runs[2])
        assert finding.fixed_in == f"{commits[3].sha[:12]} (seen passing by specwatch)"

        # Commit 6: A again, a regression: alerted, bisected from the last passing commit, named as the finding's.
        runs.append(_run(session, commits[5], {A}))
        report = analyse(session, runs[-1], config=CONFIG, now=NOW)
        (alert,) = session.scalars(select(Alert)).all()
        assert report.opened == [alert.id]
        assert (alert.kind, alert.first_bad_commit_id, alert.last_good_commit_id) == (AlertKind.violation, commits[5].id, commits[4].id)
        row = get_alert(session, alert.id)
        assert (row.findings, list(row.regressions)) == ({}, [A])
        assert row.regressions[A].key == KEY
        (opened,) = session.scalars(select(Notification.payload).where(Notification.alert_id == alert.id))
        assert opened["blocks"][0]["text"]["text"] == "Regression of a fixed known finding (losslessness violation) in lib"
        assert "regression of a fixed known finding" in str(opened["blocks"])
        assert _events(session, run_id=runs[-1]) == ["failure"]


def test_a_finding_set_open_again_applies_again(backend_factory: sessionmaker[Session]) -> None:
    """A maintainer who reopens a finding the monitor saw fixed undoes the fix: its failures are known again."""
    from service.findings import edit_finding

    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib2", 4)
        add_finding(session, "lib2", {"key": KEY, "title": "A fails", "cases": [A], "link": "https://example.org/a"})
        for commit, failing in zip(commits[:3], [{A}, set(), {A}], strict=False):
            analyse(session, _run(session, commit, failing), config=CONFIG, now=NOW)
        assert len(session.scalars(select(Alert)).all()) == 1  # commit 3: a regression
        edit_finding(session, "lib2", KEY, {"state": "open", "fixed_in": None}, now=NOW)
        assert session.scalars(select(KnownFinding.fixed_commit_id)).one() is None
        report = analyse(session, _run(session, commits[3], {A, B}), config=CONFIG, now=NOW)
        stored = session.get_one(Run, report.run_id).analysis or {}
        assert stored["findings"] == {KEY: [A]}


def test_a_fixed_findings_cases_failing_outside_its_versions_are_its_regression(backend_factory: sessionmaker[Session]) -> None:
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib3", 2)
        fields = {"key": KEY, "title": "A fails", "cases": [A], "link": "https://example.org/a", "versions": "==1.0.*"}
        add_finding(session, "lib3", fields | {"state": "fixed", "fixed_in": "1.1"})
        known = analyse(session, _run(session, commits[0], {A}, version="1.0.2"), config=CONFIG, now=NOW)
        assert known.kind is None  # in its versions: still the known bug
        again = analyse(session, _run(session, commits[1], {A}, version="1.2.0"), config=CONFIG, now=NOW)
        (alert_id,) = again.opened
        assert get_alert(session, alert_id).regressions[A].fixed_in == "1.1"


def test_a_failure_older_than_a_fixed_findings_versions_is_not_its_regression(backend_factory: sessionmaker[Session]) -> None:
    """The replay of transformers 4.40.2: the assistant-model case failed there (another bug), and the alert called it
    a regression of the finding of 4.44.* ("fixed"), a release two years later. A version before the finding's range
    did not bring it back: a plain new failure."""
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib4", 1)
        fields = {"key": KEY, "title": "A fails", "cases": [A], "link": "https://example.org/a", "versions": "==1.4.*"}
        add_finding(session, "lib4", fields | {"state": "fixed", "fixed_in": "1.5"})
        report = analyse(session, _run(session, commits[0], {A}, version="1.2.0"), config=CONFIG, now=NOW)
        (alert_id,) = report.opened
        assert get_alert(session, alert_id).regressions == {}
