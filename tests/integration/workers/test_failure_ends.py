"""A failure ends where its case stops failing that way, not only where the case passes (issue 37, the replay of
transformers 4.40.2, 4.41.2, 4.45.2 through `specwatch serve`): analysis on stored runs, no suite executed.

1. An alert's case that fails at a later commit with another signature, explained by a known finding, ends there:
   transformers' ``e2e/assistant_model/processed`` failed certainly at 4.40.2 (the stale cache position) and
   statistically at 4.41.2 (the greedy-drafting assistant, a known finding); the alert stayed open until the case
   passed at 4.45.2, so read off the alert the 4.40.2 bug lasted until 4.45.2.
2. The same with no finding: the new failure is alerted on its own (it supersedes the old signature), and the old
   alert's case ends at the new alert's first bad commit.
3. A known finding whose case keeps failing under another finding is seen fixed: ``assisted-greedy-stale-cache-
   position`` (4.40 only) covered two greedy cases; at 4.41.2 one passed and the other failed as the prompt-lookup
   overshoot, so the finding was never reported fixed.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.findings import add_finding
from service.models import Alert, AlertState, CaseResult, Commit, FindingState, Notification, Run, RunPurpose, RunStatus, Verdict
from service.notifications.outbox import NotifyConfig
from service.queries import get_finding, list_alerts
from tests.support.history import branch_commits
from workers.analysis import AnalysisConfig, analyse

A, B = "direct/far_apart/V8/g1", "direct/far_apart/V8/g3"
THRESHOLD = 1e4
CONFIG = AnalysisConfig(confirm_failures=False, notify=NotifyConfig(slack=True))
NOW = datetime(2026, 1, 1, tzinfo=UTC)
CERTAIN: dict[str, Any] = {"certain": True, "tv": (0.0, 1.0)}
STATISTICAL: dict[str, Any] = {"certain": False, "tv": (0.01, 0.91)}
GREEDY_DRAFT, STALE_CACHE, OVERSHOOT = "b-greedy-draft", "b-stale-cache", "a-overshoot"
LINK = "https://example.org/finding"


def _run(session: Session, commit: Commit, failing: dict[str, dict[str, Any]], *, purpose: RunPurpose = RunPurpose.primary) -> int:
    """A finished run of ``commit``: each case of ``failing`` fails with its signature (certain or statistical, its TV
    interval), every other case of A and B passes (``None`` as a signature: the case is in error)."""
    run = Run(commit=commit, profile="quick", purpose=purpose, status=RunStatus.failed if failing else RunStatus.passed)
    session.add(run)
    session.flush()
    for case_id in (A, B):
        how = failing.get(case_id, {})
        if case_id in failing and how is None:
            session.add(CaseResult(run_id=run.id, case_id=case_id, verdict=Verdict.ERROR, threshold=THRESHOLD))
            continue
        fails = bool(how)
        log_e = None if how.get("certain") else math.log(THRESHOLD) + (5.0 if fails else -20.0)
        session.add(
            CaseResult(
                run_id=run.id,
                case_id=case_id,
                verdict=Verdict.FAIL if fails else Verdict.PASS,
                lossless=not fails,
                conformance=True,
                n_trials=64,
                e_value=None if log_e is None else math.exp(log_e),
                log_e_value=log_e,
                threshold=THRESHOLD,
                tv_low=how["tv"][0] if fails else None,
                tv_high=how["tv"][1] if fails else None,
                details={"headline": "lossless/first2", "certain": ["lossless"] if how.get("certain") else [], "failure": "lossless"}
                if fails
                else {},
            )
        )
    session.flush()
    return run.id


def _slack(session: Session, alert: Alert) -> list[tuple[str, str]]:
    rows = session.scalars(select(Notification).where(Notification.alert_id == alert.id).order_by(Notification.id))
    return [(n.event, str(n.payload["blocks"])) for n in rows]


def test_a_case_failing_as_a_known_finding_ends_its_alerts_failure_there(backend_factory: sessionmaker[Session]) -> None:
    """The replay: A fails certainly at commit 2 (alert 1), statistically at commit 3 where a known finding (commits 3
    and 4) explains it, and passes at commit 4. Alert 1's case ends at commit 3, "it now fails as known finding ...",
    and the alert resolves there (it stayed open until commit 4, the case's pass)."""
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib-end-finding", 4)
        add_finding(
            session,
            "lib-end-finding",
            {"key": GREEDY_DRAFT, "title": "greedy draft", "link": LINK, "cases": [A], "commit_from": commits[2].sha},
        )
        for commit, failing in zip(commits, [{}, {A: CERTAIN}, {A: STATISTICAL}, {}], strict=True):
            analyse(session, _run(session, commit, failing), config=CONFIG, now=NOW)
        (alert,) = session.scalars(select(Alert)).all()
        (entry,) = alert.cases
        assert (entry["fixed_sha"], entry["fixed_order"], entry["now_fails_as"]) == (commits[2].sha, 3, {"finding": GREEDY_DRAFT})
        assert (alert.state, alert.resolved_by_commit_id) == (AlertState.resolved, commits[2].id)
        (row,) = list_alerts(session, target="lib-end-finding")
        assert row.resolved_sha == commits[2].sha
        assert row.cases[0].get("now_fails_as") == {"finding": GREEDY_DRAFT}
        (_, resolved) = _slack(session, alert)
        assert resolved[0] == "resolved"
        assert f"`{A}` fixed at `{commits[2].sha[:12]}`; it now fails as known finding `{GREEDY_DRAFT}`" in resolved[1]
        assert "passes again, or fails another way" in resolved[1]


def test_a_case_ended_as_a_finding_is_announced_and_undone_when_it_fails_its_alerts_way_again(
    backend_factory: sessionmaker[Session],
) -> None:
    """Alert 1 holds A and B from commit 2. Commit 3: A fails as the finding with another signature (ended, "partly
    fixed"), B still fails. Commit 4: A fails certainly again, the alert's own signature (the finding covers A there
    too): it came back, no longer ended. A failure the finding explains with the alert's own signature ends nothing."""
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib-end-undone", 5)
        add_finding(
            session,
            "lib-end-undone",
            {"key": GREEDY_DRAFT, "title": "greedy draft", "link": LINK, "cases": [A], "commit_from": commits[2].sha},
        )
        history = [{}, {A: CERTAIN, B: CERTAIN}, {A: STATISTICAL, B: CERTAIN}]
        for commit, failing in zip(commits, history, strict=False):
            analyse(session, _run(session, commit, failing), config=CONFIG, now=NOW)
        (alert,) = session.scalars(select(Alert)).all()
        ended = {e["case_id"]: (e.get("fixed_sha"), e.get("now_fails_as")) for e in alert.cases}
        assert ended == {A: (commits[2].sha, {"finding": GREEDY_DRAFT}), B: (None, None)}
        assert alert.state is AlertState.open
        (_, (event, text)) = _slack(session, alert)
        assert event == "fixed"
        assert f"`{A}` fixed at `{commits[2].sha[:12]}`; it now fails as known finding `{GREEDY_DRAFT}`" in text
        assert "1 case of this alert still fail" in text

        analyse(session, _run(session, commits[3], {A: CERTAIN, B: CERTAIN}), config=CONFIG, now=NOW)
        session.refresh(alert)
        assert [(e.get("fixed_sha"), e.get("now_fails_as")) for e in alert.cases] == [(None, None), (None, None)]
        analyse(session, _run(session, commits[4], {A: CERTAIN}), config=CONFIG, now=NOW)  # explained, the alert's way
        session.refresh(alert)
        assert [e["case_id"] for e in alert.cases if e.get("fixed_sha")] == [B]


def test_a_superseded_failure_ends_at_the_superseding_alerts_first_bad_commit(backend_factory: sessionmaker[Session]) -> None:
    """No finding (the replay's third table): A fails certainly at commit 2 (alert 1), statistically at commit 3, a
    new regression (alert 2, superseding alert 1's signature). Alert 1's case ends at commit 3, "it now fails another
    way" (alert 2), and alert 1 resolves there; commit 4 failing either way is known (alert 2 stands for both)."""
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "lib-end-superseded", 5)
        for commit, failing in zip(commits, [{}, {A: CERTAIN}, {A: STATISTICAL}], strict=False):
            analyse(session, _run(session, commit, failing), config=CONFIG, now=NOW)
        old, new = session.scalars(select(Alert).order_by(Alert.id)).all()
        assert (new.first_bad_commit_id, new.state) == (commits[2].id, AlertState.open)
        (entry,) = old.cases
        assert (entry["fixed_sha"], entry["now_fails_as"]) == (commits[2].sha, {"alert": new.id})
        assert (old.state, old.resolved_by_commit_id) == (AlertState.resolved, commits[2].id)
        (_, (event, text)) = _slack(session, old)
        assert event == "resolved"
        assert f"`{A}` fixed at `{commits[2].sha[:12]}`; it now fails another way, alerted as alert {new.id}" in text
        for commit, signature in ((commits[3], CERTAIN), (commits[4], STATISTICAL)):
            assert analyse(session, _run(session, commit, {A: signature}), config=CONFIG, now=NOW).kind is None
        assert len(session.scalars(select(Alert)).all()) == 2


def _findings(session: Session, name: str, commits: list[Commit], *, stale_cache_ends: bool = True) -> None:
    """``b-stale-cache`` covers A and B at commit 2 only (or from commit 2 on); ``a-overshoot`` covers them from commit 3
    on (first by key: where both cover a case, it explains it)."""
    stale = {"key": STALE_CACHE, "title": "stale cache", "link": LINK, "cases": [A, B], "commit_from": commits[1].sha}
    add_finding(session, name, stale | ({"commit_to": commits[1].sha} if stale_cache_ends else {}))
    add_finding(session, name, {"key": OVERSHOOT, "title": "overshoot", "link": LINK, "cases": [A, B], "commit_from": commits[2].sha})


@pytest.mark.parametrize(
    ("at_3", "ends", "seen_fixed"),
    [
        ({B: STATISTICAL}, True, True),  # A passes, B fails as the overshoot: fixed
        ({B: STATISTICAL}, False, False),  # the stale cache still covers B at commit 3: its failure says nothing
        ({A: STATISTICAL, B: STATISTICAL}, True, False),  # both fail as the overshoot, nothing passes: nothing seen
        ({B: None}, True, False),  # B in error says nothing
    ],
)
def test_a_finding_is_seen_fixed_while_its_other_case_fails_as_another_finding(
    backend_factory: sessionmaker[Session], at_3: dict[str, Any], ends: bool, seen_fixed: bool
) -> None:
    with session_scope(backend_factory) as session:
        name = f"lib-findings-{len(at_3)}-{ends}-{seen_fixed}-{at_3[B] is None}"
        commits = branch_commits(session, name, 3)
        _findings(session, name, commits, stale_cache_ends=ends)
        analyse(session, _run(session, commits[0], {}), config=CONFIG, now=NOW)
        report = analyse(session, _run(session, commits[1], {A: CERTAIN, B: CERTAIN}), config=CONFIG, now=NOW)
        assert (session.get_one(Run, report.run_id).analysis or {})["findings"] == {STALE_CACHE: [A, B]}
        report = analyse(session, _run(session, commits[2], at_3), config=CONFIG, now=NOW)
        analysis = session.get_one(Run, report.run_id).analysis or {}
        assert analysis["findings_fixed"] == ([STALE_CACHE] if seen_fixed else [])
        assert report.kind is None  # every failure known: no alert either way
        fixed = [str(n.payload["blocks"]) for n in session.scalars(select(Notification).where(Notification.event == "finding-fixed"))]
        assert len(fixed) == (1 if seen_fixed else 0)
        if seen_fixed:  # said as it is: one case passes, the other fails as the other finding
            assert f"{commits[2].sha[:12]}`> on main (run" in fixed[0]
            assert f"except that `{B}` fails there as known finding `{OVERSHOOT}`" in fixed[0]
        finding = get_finding(session, name, STALE_CACHE)
        assert (finding.state, finding.fixed_commit) == ((FindingState.fixed, commits[2].sha) if seen_fixed else (FindingState.open, None))
