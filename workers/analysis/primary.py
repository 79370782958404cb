"""A primary run (a new commit's): triage, commit status, confirmation or alert, drift, resolution.

1. Known failures are set aside (:func:`workers.analysis.triage.new_failures`): cases an open alert names, and
   failures a known finding explains (:mod:`workers.analysis.findings`: they page nobody).
2. The commit status says "confirming" while a confirmation is pending, else the run's outcome.
3. A run whose repository could not be used (``configuration_error``) opens the target's CONFIGURATION alert
   once (:mod:`workers.analysis.configuration`), never a per-commit one; so does an ``infrastructure_error`` (the
   commit missing, a checkout or mirror failure, the worker crashed or lost) once it persists, and never a
   broken commit: alone it is an error on its run. A run in status ``error`` of the code under test is a BROKEN
   commit at once (deterministic, nothing to confirm); one in status
   ``uninstallable`` (its install failed attempt after attempt) opens an UNINSTALLABLE alert, never a broken one;
   new failures get a confirmation run with fresh seeds (``seed_attempt`` + 1), or, with confirmation off, a
   bisection at once.
4. Passing cases are checked for acceptance drift; a drift is bisected from the newest passing commit, unless
   the run's failing cases own its bisection (then the drift alert names this commit).
5. A run that is not broken resolves the branch's alerts whose cases pass again (each case fixed at its commit, or at
   the first good commit a search finds among skipped ones; a passing run's commit status then says "fixed here");
   one that installed resolves
   the uninstallable alerts of its commit and the commits before it; one that got past its checkout resolves the
   target's configuration alert.
6. Known findings: the latest run each explained a failure of, and the findings this run sees fixed (their cases
   failed on the previous tested run and pass here: "fixed in <commit>").
"""

from __future__ import annotations

from service.history import newest_earlier_run
from service.models import AlertKind, CaseResult, Run, RunPurpose, RunStatus
from service.models.entries import AlertEntry, BrokenEntry
from service.notifications.github import queue_commit_status
from workers.analysis.alerts import open_alert
from workers.analysis.bisection import start_bisection
from workers.analysis.configuration import infrastructure_persists, target_configured, target_misconfigured
from workers.analysis.context import Analysis, child_run
from workers.analysis.drift import drifting_cases
from workers.analysis.findings import explained_failures, record_findings
from workers.analysis.resolution import resolve_installed, resolve_recovered
from workers.analysis.state import RunAnalysis
from workers.analysis.triage import entry, failure_reason, new_failures, superseding, unchanged_cases, uninstallable_entry

#: Kinds decided at once: nothing to confirm (deterministic, or not a test result).
_UNCONFIRMED = (AlertKind.broken, AlertKind.uninstallable, AlertKind.configuration)


def analyse_primary(ctx: Analysis, run: Run, cases: dict[str, CaseResult], analysis: RunAnalysis) -> None:
    session, config, report = ctx.session, ctx.config, ctx.report
    kind = _triage(ctx, run, cases, analysis)
    commit = run.commit
    state = {RunStatus.passed: "success", RunStatus.failed: "failure", RunStatus.uninstallable: "uninstallable"}.get(run.status, "error")
    if state == "failure" and kind is None and analysis.findings:  # nothing new: known findings only (and open alerts)
        state = "known"
    confirming = kind is not None and kind not in _UNCONFIRMED and config.confirm_failures
    report.notifications += queue_commit_status(session, config.notify, run, "confirming" if confirming else state)
    analysis.unchanged_cases = unchanged_cases(session, run, cases)
    if kind is AlertKind.configuration:  # the target's, not the commit's: one alert per target
        target_misconfigured(ctx, run)
    elif kind is AlertKind.broken:
        broken = BrokenEntry(case_id="(suite)", reason="broken", error=(run.error or "")[:500])
        open_alert(ctx, run, AlertKind.broken, commit, [broken])
    elif kind is AlertKind.uninstallable:
        open_alert(ctx, run, AlertKind.uninstallable, commit, [uninstallable_entry(run)])
    elif kind is not None and config.confirm_failures:
        confirmation = child_run(ctx, run, commit, RunPurpose.confirmation, seed_attempt=run.seed_attempt + 1)
        analysis.confirmation_run_id = confirmation.id if confirmation else None
    elif kind is not None:
        entries: list[AlertEntry] = [superseding(entry(cases[c], failure_reason(cases[c])), analysis) for c in analysis.failing]
        start_bisection(ctx, run, kind, entries, analysis, confirmation=None)
    drifting = drifting_cases(session, run, cases, config)
    if drifting:
        analysis.drift = [e["case_id"] for e in drifting]
        baseline = newest_earlier_run(session, commit, run.profile, [RunStatus.passed])
        if kind is None and baseline is not None:
            # Bisected between the newest passing commit (the baseline's newest, good by definition) and
            # this one: a commit is bad when a drifting case drifts from the same baseline there too.
            start_bisection(ctx, run, AlertKind.performance, drifting, analysis, confirmation=None, after=baseline.commit)
        else:  # the failing cases' search owns this run's bisection
            open_alert(ctx, run, AlertKind.performance, commit, drifting)
    fixed = _resolve(ctx, run, cases, analysis)
    if fixed and state == "success":  # the commit status says the commit fixed an alert's cases (a newer status)
        report.notifications += queue_commit_status(session, config.notify, run, "fixed")
    record_findings(ctx, run, cases, analysis)


def _triage(ctx: Analysis, run: Run, cases: dict[str, CaseResult], analysis: RunAnalysis) -> AlertKind | None:
    """The kind the run calls for once known failures are set aside (recorded in ``analysis`` and the report)."""
    kind = analysis.kind
    if kind in (AlertKind.violation, AlertKind.performance, AlertKind.exception):
        analysis.findings = explained_failures(ctx.session, run, cases)
        explained = {case_id for case_ids in analysis.findings.values() for case_id in case_ids}
        triage = new_failures(ctx.session, run, cases, explained)
        kind, analysis.failing, analysis.known_failing = triage.kind, triage.failing, triage.known_failing
        analysis.supersedes = triage.supersedes
    if run.configuration_error:
        kind = AlertKind.configuration
    elif run.infrastructure_error:  # not the commit's code: an error on the run, the target's alert if it persists
        kind = AlertKind.configuration if infrastructure_persists(ctx, run) else None
    analysis.kind = kind
    ctx.report.kind = kind.value if kind else None
    return kind


def _resolve(ctx: Analysis, run: Run, cases: dict[str, CaseResult], analysis: RunAnalysis) -> list[str]:
    """Resolve what ``run`` shows recovered; the alerts' cases fixed at its commit."""
    fixed = resolve_recovered(ctx, run, cases, analysis) if run.status not in (RunStatus.error, RunStatus.uninstallable) else []
    if run.infrastructure_error:  # it tested nothing: it resolves nothing
        return fixed
    if run.status is not RunStatus.uninstallable:
        resolve_installed(ctx, run)
    if not run.configuration_error:
        target_configured(ctx, run)
    return fixed
