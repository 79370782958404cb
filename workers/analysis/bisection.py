"""The first-bad-commit search: one midpoint run at a time, then the alert at the first bad commit.

A confirmed failure (or a drift) is searched between the last good tested commit of the branch and the
commit that found it (:func:`workers.analysis.decisions.bisect`). Each step loads the branch
(:func:`workers.analysis.history.load_branch`), says good, bad or unknown per commit
(:func:`commit_outcome`, a pure decision over the loaded runs), and queues a ``bisection`` run at the
midpoint, whose parent is the detected run; that run's analysis takes the next step. The state of the
search is a :class:`~workers.analysis.state.BisectionState` stored with the detected run.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from sqlalchemy.orm import Session

from service.models import FINISHED_STATUSES, AlertKind, AlertState, CaseResult, Commit, Run, RunPurpose, RunStatus, Verdict
from service.models.entries import RAISED, AlertEntry, alert_entries
from workers.analysis.alerts import open_alert
from workers.analysis.context import Analysis, child_run, lock_run
from workers.analysis.decisions import CONFORMANCE, LOSSLESS, CommitOutcome, Signature, bisect, signatures_differ
from workers.analysis.drift import still_drifting
from workers.analysis.history import TestedRun, load_branch
from workers.analysis.state import BisectionState, RunAnalysis, load_analysis, load_bisection, store_bisection
from workers.analysis.triage import failure_alert_spans, failure_reason, raised, signature

#: Known failures at one commit: (case, reason) pairs of the alerts that stood there.
Known = Collection[tuple[str, str]]


def commit_outcome(runs: Sequence[TestedRun], entries: Sequence[AlertEntry], known: Known = ()) -> CommitOutcome | None:
    """Good, bad or unknown (broken) for the alert's cases; None while a commit's only runs are unfinished.

    The commit's latest finished run decides. Bad: one of the cases fails for its entry's reason (a lossless
    entry needs its losslessness to fail, not its conformance alone), or a drift case drifts from the
    baseline the alert measured it against. Unknown: the run is an error or uninstallable (the commit cannot
    tell; an uninstallable commit is never counted as broken, let alone bad). An entry that ``supersedes`` an
    earlier signature of its case (a new failure of a case that was already failing) is bad only where the case
    fails with a signature other than the one it replaces: a commit where the case still fails the old way is
    good for it, so its search runs within the range where the case was already failing and names the first
    commit with the new signature. Any other case whose failure there is ``known`` (another alert stood at that
    commit for it, same reason or lossless) for another reason than this search's is not a failure of this search:
    it belongs to the other alert, as the primary run's triage sets it aside; unless another case is bad, the commit
    is then unknown (the old failure hides whether the new one is there). Known for this search's own reason, it is
    the same failure: the commit is bad, and the search names the other alert's commit again (reopening it).
    """
    finished = [r for r in runs if r.status in FINISHED_STATUSES]
    if not finished:
        return None
    latest = max(finished, key=lambda r: r.id)
    if latest.status in (RunStatus.error, RunStatus.uninstallable):
        return CommitOutcome.UNKNOWN
    masked = False
    for entry in entries:
        case = latest.cases.get(entry["case_id"])
        if case is None:
            continue
        reason = entry["reason"]
        superseding = isinstance(entry.get("supersedes"), dict)  # its own rule below: the old signature is good
        if (
            not superseding
            and case.verdict is Verdict.FAIL
            and (case.case_id, reason) not in known  # the same failure as that alert's: the search names its commit again
            and ((case.case_id, failure_reason(case)) in known or (case.case_id, LOSSLESS) in known)
        ):
            masked = True
            continue
        if entry["reason"] == "drift":
            if case.verdict is Verdict.FAIL or still_drifting(entry, case):
                return CommitOutcome.BAD
        elif case.verdict is Verdict.FAIL and (reason == CONFORMANCE or case.lossless is False or (reason == RAISED and raised(case))):
            replaced = entry.get("supersedes")
            if isinstance(replaced, dict) and not _another_failure(case, Signature.from_dict(replaced)):
                continue  # the case fails here as it already did: not this regression
            return CommitOutcome.BAD
    return CommitOutcome.UNKNOWN if masked else CommitOutcome.GOOD


def _another_failure(case: CaseResult, replaced: Signature) -> bool:
    """Does failing ``case`` fail otherwise than with ``replaced`` (its signature for the replaced one's reason)?"""
    reason = failure_reason(case)
    return reason != replaced.reason or signatures_differ(signature(case, reason), replaced)


#: An alert's span of branch orders (first bad, resolving commit exclusive or None) and its (case, reason) pairs.
Standing = list[tuple[tuple[int, int | None], set[tuple[str, str]]]]


def known_at(standing: Standing, order: int) -> set[tuple[str, str]]:
    """The failures known at the commit of branch order ``order``: those of the alerts that stood there."""
    return {pair for (began, ended), pairs in standing for pair in pairs if began <= order and (ended is None or order < ended)}


def standing_alerts(session: Session, detected: Run) -> Standing:
    """The failure alerts of ``detected``'s branch other than its own, each with the branch orders it stood over
    (from its first bad commit to the commit that resolved it, exclusive; open: onwards) and its (case, reason)
    pairs: the failures known at each commit of the search."""
    standing: Standing = []
    for alert, began, ended in failure_alert_spans(session, detected.commit):
        if alert.detected_run_id == detected.id or (alert.state is AlertState.resolved and ended is None):
            continue  # its own alert; resolved by hand: where it ended is not known
        standing.append(((began, ended), {(e["case_id"], str(e["reason"])) for e in alert_entries(alert.cases)}))
    return standing


def start_bisection(
    ctx: Analysis,
    detected: Run,
    kind: AlertKind,
    entries: Sequence[AlertEntry],
    analysis: RunAnalysis,
    *,
    confirmation: Run | None,
    after: Commit | None = None,
) -> None:
    """Search the first bad commit for ``entries`` found by ``detected`` (``analysis``: its analysis being built).

    ``after``: a known good commit that bounds the search (a drift's baseline: older commits are measured
    against another baseline and say nothing).
    """
    state = BisectionState(
        kind=kind,
        cases=tuple(entries),
        confirmation_run_id=confirmation.id if confirmation else None,
        after_sha=after.sha if after is not None else None,
        after_order=after.branch_order if after is not None else None,
    )
    _step(ctx, detected, analysis, state)


def continue_bisection(ctx: Analysis, run: Run) -> None:
    """The next step of the search that bisection run ``run`` served (its parent's)."""
    detected = lock_run(ctx.session, run.parent_run_id) if run.parent_run_id is not None else None
    if detected is None:
        return
    state = load_bisection(detected)
    if state is not None:
        _step(ctx, detected, load_analysis(detected), state)


def _step(ctx: Analysis, detected: Run, analysis: RunAnalysis, state: BisectionState) -> None:
    if state.done:
        return
    commit = detected.commit
    branch = load_branch(ctx.session, detected, since_order=state.after_order)
    outcomes: dict[str, CommitOutcome] = {}
    # Commits whose run for this search is still going: its analysis resumes the search. Another run of the
    # commit (its own primary run, another search's) would not, so the search queues its own then.
    in_flight: set[str] = set()
    standing = standing_alerts(ctx.session, detected)
    for step in branch.commits:
        outcome = commit_outcome(step.runs, state.cases, known_at(standing, step.commit.branch_order or 0))
        if outcome is not None:
            outcomes[step.commit.sha] = outcome
        elif any(r.parent_run_id == detected.id for r in step.runs):
            in_flight.add(step.commit.sha)
    if state.after_sha:
        outcomes[state.after_sha] = CommitOutcome.GOOD
    outcomes[commit.sha] = CommitOutcome.BAD
    decision = bisect(branch.shas, outcomes)
    if decision.next_to_test is not None:
        runs = state.runs
        if decision.next_to_test not in in_flight:
            midpoint = branch.commit(decision.next_to_test)
            assert midpoint is not None
            if child_run(ctx, detected, midpoint, RunPurpose.bisection) is not None:
                runs += 1
        store_bisection(detected, analysis, state.model_copy(update={"runs": runs, "next": decision.next_to_test}))
        return
    update = {"done": True, "first_bad": decision.first_bad, "last_good": decision.last_good}
    store_bisection(detected, analysis, state.model_copy(update=update))
    first_bad = (branch.commit(decision.first_bad) if decision.first_bad else None) or commit
    last_good = branch.commit(decision.last_good) if decision.last_good else None
    confirmation = ctx.session.get(Run, state.confirmation_run_id) if state.confirmation_run_id else None
    open_alert(
        ctx,
        detected,
        state.kind,
        first_bad,
        list(state.cases),
        last_good=last_good,
        confirmation=confirmation,
        bisection_runs=state.runs,
    )
