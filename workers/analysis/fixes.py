"""The first-good-commit search: where a case of an alert was fixed, when the commits before the run that saw it pass
were not tested (a policy other than ``every``: a push of several commits tests its head).

A primary run that sees cases of an alert fixed marks them fixed at its commit (:mod:`workers.analysis.resolution`)
and starts a search over the commits between the newest one where they failed and its own, the mirror of the
first-bad-commit search (:func:`workers.analysis.decisions.bisect_fix`): one ``bisection`` run at a time at the
midpoint, whose parent is the run that saw the fix; that run's analysis takes the next step. A commit is bad while
one of the cases fails there as its entry says, good when they all pass, unknown when its run could not test it. When
the first good commit is an earlier one, the cases' ``fixed_sha`` moves there (and the alert's resolving commit, if it
resolved by them), and Slack says so ("fix-located"). The state is a :class:`~workers.analysis.state.FixSearch` in the
seeing run's analysis.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from service.models import FINISHED_STATUSES, Alert, AlertState, CaseResult, Commit, Run, RunPurpose, RunStatus, Verdict
from service.models.entries import AlertEntry, alert_entries
from service.notifications.slack import queue_alert_message
from workers.analysis.context import Analysis, child_run, lock_run
from workers.analysis.decisions import CommitOutcome, bisect_fix
from workers.analysis.drift import still_drifting
from workers.analysis.history import TestedRun, load_branch
from workers.analysis.state import FixSearch, RunAnalysis, load_analysis, store_analysis
from workers.analysis.triage import raised

log = logging.getLogger(__name__)


def fails_again(entry: AlertEntry, case: CaseResult | None) -> bool:
    """Does ``case`` fail the way ``entry`` says its case failed (its reason; a drift drifting still)?"""
    if case is None:
        return False
    if entry["reason"] == "drift":
        return case.verdict is Verdict.FAIL or still_drifting(entry, case)
    if case.verdict is not Verdict.FAIL:
        return False
    return (
        entry["reason"] == "conformance"
        or (entry["reason"] == "lossless" and case.lossless is False)
        or (entry["reason"] == "raised" and raised(case))
    )


def fix_outcome(runs: Sequence[TestedRun], entries: Sequence[AlertEntry]) -> CommitOutcome | None:
    """Bad while one of ``entries``' cases fails there as its entry says, good when each of them passes, unknown when
    the commit's latest finished run could not test it (or left a case out); None while its runs are unfinished."""
    finished = [r for r in runs if r.status in FINISHED_STATUSES]
    if not finished:
        return None
    latest = max(finished, key=lambda r: r.id)
    if latest.status in (RunStatus.error, RunStatus.uninstallable):
        return CommitOutcome.UNKNOWN
    cases = [latest.cases.get(e["case_id"]) for e in entries]
    if any(fails_again(e, c) for e, c in zip(entries, cases, strict=True)):
        return CommitOutcome.BAD
    return CommitOutcome.GOOD if all(c is not None and c.verdict is Verdict.PASS for c in cases) else CommitOutcome.UNKNOWN


def start_fix_search(ctx: Analysis, run: Run, analysis: RunAnalysis, alert: Alert, cases: Sequence[str]) -> None:
    """Search the first good commit of ``cases`` of ``alert``, seen fixed by primary ``run`` (``analysis``: its analysis
    being built); recorded only when commits were skipped between the newest failing one and ``run``'s."""
    search = _step(ctx, run, alert, FixSearch(alert_id=alert.id, cases=tuple(cases)))
    if search.runs or not search.done:
        analysis.fix_searches = [*analysis.fix_searches, search]


def continue_fix_searches(ctx: Analysis, run: Run) -> None:
    """The next step of the searches that bisection run ``run`` served (its parent's)."""
    seeing = lock_run(ctx.session, run.parent_run_id) if run.parent_run_id is not None else None
    if seeing is None:
        return
    analysis = load_analysis(seeing)
    if not any(not s.done for s in analysis.fix_searches):
        return
    searches = []
    for search in analysis.fix_searches:
        alert = ctx.session.scalars(select(Alert).where(Alert.id == search.alert_id).with_for_update()).one_or_none()
        searches.append(search if search.done or alert is None else _step(ctx, seeing, alert, search))
    analysis.fix_searches = searches
    store_analysis(seeing, analysis)


def _step(ctx: Analysis, seeing: Run, alert: Alert, search: FixSearch) -> FixSearch:
    """One step of ``search``: the next midpoint queued, or the answer (and the fix moved to it)."""
    first_bad = ctx.session.get_one(Commit, alert.first_bad_commit_id)
    branch = load_branch(ctx.session, seeing, since_order=first_bad.branch_order)
    entries = [e for e in alert_entries(alert.cases) if e["case_id"] in search.cases]
    outcomes: dict[str, CommitOutcome] = {}
    in_flight: set[str] = set()
    for step in branch.commits:
        outcome = fix_outcome(step.runs, entries)
        if outcome is not None:
            outcomes[step.commit.sha] = outcome
        elif any(r.parent_run_id == seeing.id for r in step.runs):
            in_flight.add(step.commit.sha)
    outcomes[first_bad.sha] = CommitOutcome.BAD
    outcomes[seeing.commit.sha] = CommitOutcome.GOOD
    decision = bisect_fix(branch.shas, outcomes)
    if decision.next_to_test is not None:
        runs = search.runs
        midpoint = branch.commit(decision.next_to_test)
        if decision.next_to_test not in in_flight and midpoint is not None and child_run(ctx, seeing, midpoint, RunPurpose.bisection):
            runs += 1
        return search.model_copy(update={"runs": runs, "next": decision.next_to_test})
    done = search.model_copy(update={"done": True, "next": None, "first_good": decision.first_good, "last_bad": decision.last_bad})
    first_good = branch.commit(decision.first_good) if decision.first_good else None
    if first_good is not None and first_good.id != seeing.commit_id:
        _move_fix(ctx, alert, done, seeing.commit, first_good)
    return done


def _move_fix(ctx: Analysis, alert: Alert, search: FixSearch, seen: Commit, first_good: Commit) -> None:
    """``search``'s cases were fixed at ``first_good``, before ``seen`` (where they were seen passing): their
    ``fixed_sha`` moves there, and the alert's resolving commit when it was ``seen`` for the last of its cases."""
    entries: list[dict[str, Any]] = [dict(e) for e in alert_entries(alert.cases)]
    moved = []
    for entry in entries:
        if entry["case_id"] in search.cases and entry.get("fixed_sha") == seen.sha:
            entry["fixed_sha"], entry["fixed_order"] = first_good.sha, first_good.branch_order or 0
            moved.append(entry["case_id"])
    if not moved:
        return  # failed again since, or fixed elsewhere meanwhile: the search's answer is stale
    alert.cases = alert_entries(entries)
    if alert.state is AlertState.resolved and alert.resolved_by_commit_id == seen.id:
        last = max(entries, key=lambda e: int(e.get("fixed_order", 0)))
        found = ctx.session.scalars(select(Commit).where(Commit.target_id == alert.target_id, Commit.sha == last.get("fixed_sha"))).first()
        alert.resolved_by_commit_id = found.id if found is not None else alert.resolved_by_commit_id
    ctx.report.notifications += queue_alert_message(ctx.session, ctx.config.notify, alert, "fix-located", about=moved)
    log.info("alert_fix_located alert_id=%s cases=%s first_good=%s seen=%s runs=%s", alert.id, moved, first_good.sha, seen.sha, search.runs)
