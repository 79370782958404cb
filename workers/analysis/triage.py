"""Triage of a finished run's cases: why each failed, which failures are already known, what is unchanged.

A case that already fails in an unresolved alert of the branch (same case, same reason) is *known*: it is set
aside, so that only new failures are confirmed, bisected and alerted, and a standing failure never hides a
later regression.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from service.history import alert_branch, open_alerts, previous_tested_run
from service.models import Alert, AlertKind, CaseResult, Commit, Run, Verdict
from service.models.entries import RAISED, FailureEntry, RaisedEntry, TestedEntry, UninstallableEntry, alert_entries
from workers.analysis.context import load_cases
from workers.analysis.decisions import CONFORMANCE, LOSSLESS, CaseOutcome, Signature, signatures_differ
from workers.analysis.state import RunAnalysis


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


def _first_line(case: CaseResult) -> str:
    """The exception's first line (the case's reason holds its traceback too)."""
    return str((case.details or {}).get("reason", "")).split("\n")[0][:500]


def signature(case: CaseResult, reason: FailureReason | None = None) -> Signature:
    """A failing case's signature (:class:`workers.analysis.decisions.Signature`) for ``reason`` (its worst by
    default): the exception's type for a case that raised; else the headline check and the checks of the layer
    that rejected, certain or statistical, and the headline's TV interval."""
    reason = reason or failure_reason(case)
    details = case.details or {}
    if reason == RAISED:
        return Signature(RAISED, _first_line(case).split(":")[0].strip() or None, "exception")
    certain = reason in (details.get("certain") or ()) or ("certain" not in details and case.log_e_value is None)
    headline = details.get("headline")
    tv = (case.tv_low, case.tv_high) if case.tv_low is not None and case.tv_high is not None else None
    rejected = frozenset(
        str(c["name"])
        for c in details.get("checks") or ()
        if isinstance(c, dict) and c.get("rejected") and c.get("layer") == reason and "name" in c
    )
    return Signature(reason, str(headline) if headline else None, "certain" if certain else "statistical", tv, rejected)


def entry(case: CaseResult, reason: FailureReason) -> FailureEntry:
    """A failing case as an alert lists it (``Alert.cases``), with the figures of the run that found it and its
    signature."""
    found: FailureEntry
    if reason == RAISED:
        found = RaisedEntry(case_id=case.case_id, reason=RAISED, error=_first_line(case))
    else:
        found = TestedEntry(
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
    found["signature"] = signature(case, reason).as_dict()
    return found


def superseding(found: FailureEntry, analysis: RunAnalysis) -> FailureEntry:
    """``found`` with the signature it replaces when its case was already failing with another one."""
    replaced = analysis.supersedes.get(found["case_id"])
    if replaced is not None and found.get("signature", {}).get("reason") == replaced.get("reason"):
        found["supersedes"] = replaced
    return found


#: What :func:`uninstallable_entry` reads the requirement from: ``could not install: REQUIREMENT (why...)``.
_NOT_INSTALLED = re.compile(r"could not install: (\S+)")


def uninstallable_entry(run: Run) -> UninstallableEntry:
    """An uninstallable run as its alert lists it: the requirement that could not be installed, and why."""
    error = run.error or ""
    found = _NOT_INSTALLED.search(error)
    return UninstallableEntry(case_id="(install)", reason="uninstallable", requirement=found[1] if found else None, error=error[:500])


#: The alert kinds that stand for failures of cases (what triage sets aside, a search masks, a confirmation weighs).
FAILURE_KINDS = (AlertKind.violation, AlertKind.exception, AlertKind.performance)


def signatures_of(alerts: Iterable[Alert]) -> dict[tuple[str, str], list[Signature | None]]:
    """The (case, reason) pairs of ``alerts`` with the signatures their entries recorded (None: an entry written
    before signatures, which any signature matches), and the signature each entry supersedes: the alert that
    replaced a failure stands for it while it is open (the superseded alert's case ended where it began,
    :func:`workers.analysis.resolution.end_superseded`), so the old signature coming back beside the new one in the
    same case is not news."""
    known: dict[tuple[str, str], list[Signature | None]] = {}
    for alert in alerts:
        for e in alert_entries(alert.cases):
            stored, replaced = e.get("signature"), e.get("supersedes")
            recorded = known.setdefault((e["case_id"], e["reason"]), [])
            if isinstance(replaced, dict) and replaced.get("reason") == e["reason"]:
                recorded.append(Signature.from_dict(replaced))
            recorded.append(Signature.from_dict(stored) if isinstance(stored, dict) else None)
    return known


def known_failures(session: Session, run: Run) -> dict[tuple[str, str], list[Signature | None]]:
    """(case, reason) pairs of the branch's alerts that are not resolved and began at or before this commit, with
    the signatures their entries recorded (:func:`signatures_of`)."""
    return signatures_of(open_alerts(session, run.commit, at_commit=True, kinds=list(FAILURE_KINDS)))


def failure_alert_spans(session: Session, commit: Commit) -> list[tuple[Alert, int, int | None]]:
    """The failure alerts of ``commit``'s branch (:data:`FAILURE_KINDS`), each with the branch order of its first bad
    commit and of the commit that resolved it (None: open, or resolved by hand), by id."""
    first_bad, resolver = aliased(Commit), aliased(Commit)
    rows = session.execute(
        select(Alert, first_bad.branch_order, resolver.branch_order)
        .join(first_bad, Alert.first_bad_commit_id == first_bad.id)
        .outerjoin(resolver, Alert.resolved_by_commit_id == resolver.id)
        .where(Alert.target_id == commit.target_id, Alert.branch == alert_branch(commit), Alert.kind.in_(FAILURE_KINDS))
        .order_by(Alert.id)
    ).all()
    return [(alert, began or 0, ended) for alert, began, ended in rows]


@dataclass(frozen=True)
class Triage:
    """A run's failures once the known ones are set aside (:func:`new_failures`)."""

    kind: AlertKind | None
    failing: list[str]  # new, worst first
    known_failing: list[str]
    #: New failures of cases that an open alert already names with another signature: the signature they replace
    #: (their search runs within the range where the case was already failing).
    supersedes: dict[str, dict[str, object]] = field(default_factory=dict)


def new_failures(session: Session, run: Run, cases: dict[str, CaseResult], explained: Collection[str] = ()) -> Triage:
    """The run's kind and failing cases once the known failures are set aside, and the known ones.

    Known: a case that an open alert of the branch names, or one in ``explained`` (a known finding explains its
    failure here, :mod:`workers.analysis.findings`). A known case keeps failing until its alert resolves, and
    counting it again would make every later regression's bisection land on the old first bad commit (merged
    quietly into the old alert). Exceptions are set aside as violations are: a case that raised is known while an
    open alert (of any kind) names it as raised. New lossless failures make a VIOLATION; else new raised cases an
    EXCEPTION; else new conformance-only failures a PERFORMANCE regression. Every new failing case is returned
    (worst first), whatever the kind: a case that raised beside a lossy one is new or known, never dropped.

    Known means known with the same signature: a case that an open alert names failing for the same reason, but
    now with a signature that differs from every one recorded for it (:func:`~workers.analysis.decisions.signatures_differ`:
    another check, certain turned statistical or back, a disjoint TV interval) is a new regression at this commit.
    """
    known = known_failures(session, run)
    failing = sorted((c for c in cases.values() if c.verdict is Verdict.FAIL), key=lambda c: c.case_id)
    fresh: list[CaseResult] = []
    supersedes: dict[str, dict[str, object]] = {}
    for c in failing:
        reason = failure_reason(c)
        if c.case_id in explained:
            continue
        # A known lossless failure covers the same case failing conformance only (a weak bug's lossless check can
        # miss the threshold in one run while its conformance still fails); the reverse is new (worse) news, and
        # so is a case known lossy that now raises (another failure).
        if reason == CONFORMANCE and (c.case_id, LOSSLESS) in known:
            continue
        recorded = known.get((c.case_id, reason))
        if recorded is None:
            fresh.append(c)
            continue
        now = signature(c, reason)
        if any(old is None or not signatures_differ(now, old) for old in recorded):
            continue
        fresh.append(c)
        supersedes[c.case_id] = next(old for old in reversed(recorded) if old is not None).as_dict()
    already = [c.case_id for c in failing if c not in fresh]
    order: tuple[FailureReason, ...] = ("lossless", "raised", "conformance")
    ranked = sorted(fresh, key=lambda c: order.index(failure_reason(c)))
    if not ranked:
        return Triage(None, [], already)
    worst = failure_reason(ranked[0])
    kind = AlertKind.violation if worst == LOSSLESS else AlertKind.exception if worst == RAISED else AlertKind.performance
    return Triage(kind, [c.case_id for c in ranked], already, supersedes)


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
