"""Triage of a finished run's cases: why each failed, which failures are already known, what is unchanged.

A case that already fails in an unresolved alert of the branch (same case, same reason) is *known*: it is set
aside, so that only new failures are confirmed, bisected and alerted, and a standing failure never hides a
later regression.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Literal

from sqlalchemy.orm import Session

from service.history import open_alerts, previous_tested_run
from service.models import AlertKind, CaseResult, Run, Verdict
from service.models.entries import RAISED, FailureEntry, RaisedEntry, TestedEntry, UninstallableEntry, alert_entries
from workers.analysis.context import load_cases
from workers.analysis.decisions import CONFORMANCE, LOSSLESS, CaseOutcome


def raised(case: CaseResult) -> bool:
    """The target raised on a valid input in this case (a failing case, never an error)."""
    return (case.details or {}).get("failure") == "raised"


def case_outcomes(cases: dict[str, CaseResult]) -> list[CaseOutcome]:
    return [CaseOutcome(c.case_id, c.verdict.value, c.lossless, c.conformance, raised=raised(c)) for c in cases.values()]


FailureReason = Literal["lossless", "conformance", "raised"]


def failure_reason(case: CaseResult) -> FailureReason:
    """An alert entry's reason for a failing case: its worst failure (lossless, then the target raising)."""
    if case.lossless is False:
        return "lossless"
    return RAISED if raised(case) else "conformance"


def entry(case: CaseResult, reason: FailureReason) -> FailureEntry:
    """A failing case as an alert lists it (``Alert.cases``), with the figures of the run that found it."""
    if reason == RAISED:  # the exception's first line (the case's reason holds its traceback too)
        return RaisedEntry(case_id=case.case_id, reason=RAISED, error=str((case.details or {}).get("reason", "")).split("\n")[0][:500])
    return TestedEntry(
        case_id=case.case_id,
        reason=reason,
        e_value=case.e_value,
        log_e_value=case.log_e_value,
        threshold=case.threshold,
        tv_estimate=case.tv_estimate,
        acceptance_observed=case.acceptance_observed,
        acceptance_expected=case.acceptance_expected,
        n_trials=case.n_trials,
    )


#: What :func:`uninstallable_entry` reads the requirement from: ``could not install: REQUIREMENT (why...)``.
_NOT_INSTALLED = re.compile(r"could not install: (\S+)")


def uninstallable_entry(run: Run) -> UninstallableEntry:
    """An uninstallable run as its alert lists it: the requirement that could not be installed, and why."""
    error = run.error or ""
    found = _NOT_INSTALLED.search(error)
    return UninstallableEntry(case_id="(install)", reason="uninstallable", requirement=found[1] if found else None, error=error[:500])


def known_failures(session: Session, run: Run) -> set[tuple[str, str]]:
    """(case, reason) pairs of the branch's alerts that are not resolved and began at or before this commit."""
    alerts = open_alerts(session, run.commit, at_commit=True, kinds=[AlertKind.violation, AlertKind.exception, AlertKind.performance])
    return {(e["case_id"], e["reason"]) for alert in alerts for e in alert_entries(alert.cases)}


def new_failures(
    session: Session, run: Run, cases: dict[str, CaseResult], explained: Collection[str] = ()
) -> tuple[AlertKind | None, list[str], list[str]]:
    """The run's kind and failing cases once the known failures are set aside, and the known ones.

    Known: a case that an open alert of the branch names, or one in ``explained`` (a known finding explains its
    failure here, :mod:`workers.analysis.findings`). A known case keeps failing until its alert resolves, and
    counting it again would make every later regression's bisection land on the old first bad commit (merged
    quietly into the old alert). Exceptions are set aside as violations are: a case that raised is known while an
    open alert (of any kind) names it as raised. New lossless failures make a VIOLATION; else new raised cases an
    EXCEPTION; else new conformance-only failures a PERFORMANCE regression. Every new failing case is returned
    (worst first), whatever the kind: a case that raised beside a lossy one is new or known, never dropped.
    """
    known = known_failures(session, run)
    failing = sorted((c for c in cases.values() if c.verdict is Verdict.FAIL), key=lambda c: c.case_id)
    # A known lossless failure covers the same case failing conformance only (a weak bug's lossless check can
    # miss the threshold in one run while its conformance still fails); the reverse is new (worse) news, and so
    # is a case known lossy that now raises (another failure).
    fresh = [
        c
        for c in failing
        if (c.case_id, failure_reason(c)) not in known
        and not (failure_reason(c) == CONFORMANCE and (c.case_id, LOSSLESS) in known)
        and c.case_id not in explained
    ]
    already = [c.case_id for c in failing if c not in fresh]
    order: tuple[FailureReason, ...] = ("lossless", "raised", "conformance")
    ranked = sorted(fresh, key=lambda c: order.index(failure_reason(c)))
    if not ranked:
        return None, [], already
    worst = failure_reason(ranked[0])
    kind = AlertKind.violation if worst == LOSSLESS else AlertKind.exception if worst == RAISED else AlertKind.performance
    return kind, [c.case_id for c in ranked], already


def unchanged_cases(session: Session, run: Run, cases: dict[str, CaseResult]) -> list[str]:
    """Cases whose seeded output fingerprint equals the previous tested run's (:func:`service.history.previous_tested_run`)."""
    previous = previous_tested_run(session, run.commit, run.profile)
    if previous is None:
        return []
    before = load_cases(session, previous.id)
    return sorted(
        case_id
        for case_id, case in cases.items()
        if case.fingerprint and case_id in before and before[case_id].fingerprint == case.fingerprint
    )
