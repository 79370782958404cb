"""Known findings in the analysis: a known failure pages nobody, a finding that stops failing is seen fixed, and a
fixed finding failing again is a regression.

The policy (``docs/findings.md``, "Known findings in the monitor"):

1. A failure that a known finding explains at its commit (:class:`service.queries.findings.FindingMatcher`) is
   *known*: it is set aside like a case an open alert names (no confirmation, no alert, no Slack message). The run
   still fails: its commit status says so ("known findings only"), the timeline shows the commit as known-only,
   and the finding's page names its latest failing run (``known_findings.last_failed_run_id``).
2. A finding **stops failing** when a primary run explains nothing by it and, of the cases that it explained
   failing on the previous tested run (same branch and profile, :func:`service.history.previous_tested_run`), at
   least one passes and each other one fails explained by *another* known finding that it does not cover itself
   here (its versions or commits end before this one): it is *seen fixed* at this commit (``fixed_commit_id``; an
   open finding becomes fixed, ``fixed_in`` naming the commit unless it said where already), and Slack says "fixed
   in <commit>" (:func:`service.notifications.findings.queue_finding_fixed`). A case missing, skipped or in error
   says nothing. The catalogue's attribution is trusted for the case failing under another finding because that
   is what the catalogue is for: each finding was reproduced on its own (a minimal script against the exact law,
   the library's one-line fix) with the versions it affects, so where only the other one covers the case, the
   failure there is the other mechanism's, and asking that case to pass would keep a fixed finding open for as
   long as an unrelated bug lives in one of its cases (transformers' stale cache position, fixed in 4.41, beside
   the prompt-lookup overshoot in the same greedy case until 5.14). If the attribution were wrong (the finding's
   own bug still there under the other one), the case's failure outlives the other finding's fix and then alerts
   as a regression of this one: the safe side, as below.
3. From that commit on (on its branch, or among the releases) the finding no longer applies: a failure of its
   cases there is new, so it is confirmed, bisected between the passing commit and the failure, and alerted; the
   alert names it a regression of the finding (:meth:`~service.queries.findings.FindingMatcher.regression`), as
   it does for a failure of a fixed finding's cases outside its versions and commits.

A pass can be a miss: a case passes at its trial cap only when the law is within its design TV of the truth with
power 1 - beta (beta = 1e-3 by default), so a weaker bug than the design can read as "fixed"; the next failure
then alerts as a regression, which is the safe side.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.history import TESTED_STATUSES, previous_tested_run
from service.models import CaseResult, FindingState, KnownFinding, Run, Verdict
from service.notifications.findings import queue_finding_fixed
from service.queries.findings import FindingMatcher, commit_version, finding_matcher
from service.releases import release_version
from workers.analysis.context import Analysis, load_cases
from workers.analysis.state import RunAnalysis

log = logging.getLogger(__name__)


def explained(matcher: FindingMatcher, run: Run, cases: Mapping[str, CaseResult]) -> dict[str, list[str]]:
    """The known findings that explain failures of ``run``: finding key -> its failing cases (sorted)."""
    failing = sorted(c.case_id for c in cases.values() if c.verdict is Verdict.FAIL)
    if not failing or not matcher:
        return {}
    commit = run.commit
    links = matcher.match_all(
        failing,
        version=commit_version(commit.sha, run.library_version),
        distribution=run.library_distribution,
        branch=commit.branch,
        branch_order=commit.branch_order,
    )
    by_key: dict[str, list[str]] = {}
    for case_id, link in links.items():
        by_key.setdefault(link.key, []).append(case_id)
    return by_key


def explained_failures(session: Session, run: Run, cases: Mapping[str, CaseResult]) -> dict[str, list[str]]:
    """:func:`explained` with the target's findings as they stand."""
    return explained(finding_matcher(session, run.commit.target_id), run, cases)


def _locked(session: Session, target_id: int, keys: Collection[str]) -> list[KnownFinding]:
    if not keys:
        return []
    query = select(KnownFinding).where(KnownFinding.target_id == target_id, KnownFinding.key.in_(sorted(keys)))
    return list(session.scalars(query.order_by(KnownFinding.id).with_for_update()))


def _where(run: Run) -> str:
    version = release_version(run.commit.sha)
    return f"release {version}" if version else run.commit.sha[:12]


def record_findings(ctx: Analysis, run: Run, cases: Mapping[str, CaseResult], analysis: RunAnalysis) -> None:
    """After primary ``run``'s triage: its known findings' latest failing run, and the findings it sees fixed."""
    session = ctx.session
    target_id = run.commit.target_id
    for row in _locked(session, target_id, analysis.findings):
        if row.last_failed_run_id is None or row.last_failed_run_id < run.id:
            row.last_failed_run_id = run.id
    if run.status not in TESTED_STATUSES:
        return
    previous = previous_tested_run(session, run.commit, run.profile)
    if previous is None:
        return
    matcher = finding_matcher(session, target_id)
    before = explained(matcher, previous, load_cases(session, previous.id))
    elsewhere = {case_id: key for key, case_ids in analysis.findings.items() for case_id in case_ids}
    passing = {
        key
        for key, failed in before.items()
        if key not in analysis.findings and _ended(matcher, run, key, cases=cases, failed=failed, elsewhere=elsewhere)
    }
    for row in _locked(session, target_id, passing):
        if row.fixed_commit_id is not None:  # seen fixed already (a later analysis of an earlier commit, a rerun)
            continue
        row.fixed_commit_id = run.commit_id
        if row.state is FindingState.open:
            row.state = FindingState.fixed
            row.fixed_in = row.fixed_in or f"{_where(run)} (seen passing by specwatch)"
        row.updated_at = ctx.now
        analysis.findings_fixed.append(row.key)
        others = {case_id: elsewhere[case_id] for case_id in before[row.key] if case_id in elsewhere}
        ctx.report.notifications += queue_finding_fixed(session, ctx.config.notify, row, run, previous, elsewhere=others)
        log.warning("finding_fixed target_id=%s key=%s commit=%s last_failing_run=%s", target_id, row.key, run.commit.sha, previous.id)


def _ended(
    matcher: FindingMatcher, run: Run, key: str, *, cases: Mapping[str, CaseResult], failed: Collection[str], elsewhere: Mapping[str, str]
) -> bool:
    """Has finding ``key``'s failure of ``failed`` (its cases failing on the previous tested run) ended in ``run``?
    Yes when at least one of them passes and each other one fails explained by another known finding
    (``elsewhere``: case -> the finding that explains its failure here) that ``key`` itself does not cover here;
    a case missing, skipped or in error says nothing about a fix."""
    commit = run.commit
    version = commit_version(commit.sha, run.library_version)

    def ended(case_id: str) -> bool:
        case = cases.get(case_id)
        if case is None or case.verdict is not Verdict.FAIL:
            return case is not None and case.verdict is Verdict.PASS
        if elsewhere.get(case_id, key) == key:
            return False
        distribution, branch, order = run.library_distribution, commit.branch, commit.branch_order
        return not matcher.applies(key, case_id, version=version, distribution=distribution, branch=branch, branch_order=order)

    passes = [c for c in failed if c in cases and cases[c].verdict is Verdict.PASS]
    return bool(passes) and all(ended(c) for c in failed)
