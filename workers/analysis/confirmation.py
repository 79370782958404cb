"""Confirmation: a failing primary run's commit tested again with fresh seeds, per case and per layer.

The confirmation run's analysis confirms each failing case of its parent only within the layer that failed:
the same check's stopped e-values multiplied, that check rejecting again, a certain violation of that layer,
or the target raising again (:func:`workers.analysis.decisions.confirmation`). The alert's kind follows the
layer confirmed; a confirmed case starts the first-bad-commit search. No case confirmed: no alert (recorded
on both runs).
"""

from __future__ import annotations

import logging
import math

from sqlalchemy.orm import Session

from service.models import AlertKind, AlertState, CaseResult, Run, RunStatus, Verdict
from service.models.entries import RAISED, FailureEntry
from service.notifications.github import queue_commit_status
from workers.analysis.bisection import start_bisection
from workers.analysis.context import Analysis, load_cases, lock_run
from workers.analysis.decisions import (
    CONFORMANCE,
    LOSSLESS,
    REPLAYED,
    CheckEvidence,
    RunEvidence,
    Signature,
    confirmation,
    signatures_differ,
)
from workers.analysis.state import RunAnalysis, load_analysis
from workers.analysis.triage import FailureReason, entry, failure_alert_spans, failure_reason, raised, signatures_of, superseding

log = logging.getLogger(__name__)


def evidence(case: CaseResult | None) -> RunEvidence | None:
    """A stored case result as confirmation evidence (None when it measured nothing: error, skipped)."""
    if case is None or case.threshold is None or case.verdict in (Verdict.ERROR, Verdict.SKIPPED):
        return None
    details = case.details or {}
    checks = []
    for check in details.get("checks") or []:
        if not isinstance(check, dict) or "name" not in check:
            continue
        # Schema 1 results have no stopped e-value: their running maxima are not e-values, so they add nothing
        # to a product (-inf); a rejection in both runs still confirms.
        stopped = check.get("stopped_log_e_value", -math.inf)
        checks.append(CheckEvidence(str(check["name"]), str(check.get("layer", "")), bool(check.get("rejected")), stopped))
    if not checks and case.verdict is Verdict.FAIL:
        # No per-check evidence (schema 1 rows): the layer's rejection stands for its checks, so only a
        # rejection of the same layer in both runs confirms (the product route needs stopped e-values).
        failed = {LOSSLESS: case.lossless is False, CONFORMANCE: case.conformance is False}
        checks = [CheckEvidence(f"({layer})", layer, True, -math.inf) for layer, yes in failed.items() if yes]
    certain = set(details.get("certain") or [])
    if "certain" not in details and case.log_e_value is None and case.verdict is Verdict.FAIL:
        certain.add(failure_reason(case))  # schema 1: log E None marked a certain violation of the failed layer
    replay = details.get("replay")
    replayed = frozenset(str(layer) for layer in replay.get("certain") or []) if isinstance(replay, dict) else frozenset[str]()
    return RunEvidence(case.threshold, tuple(checks), frozenset(certain), raised=raised(case), replayed=replayed)


def failed_layers(case: CaseResult) -> list[FailureReason]:
    """The layers a failing case failed in, worst first: what its confirmation may confirm."""
    layers: list[FailureReason] = ["lossless"] if case.lossless is False else []
    if raised(case):
        layers.append(RAISED)
    if case.conformance is False:
        layers.append("conformance")
    return layers or [failure_reason(case)]


def _confirmed_entries(parent: Run, first: dict[str, CaseResult], again: dict[str, CaseResult]) -> list[FailureEntry]:
    """The alert entries of the parent's failing cases that the rerun confirms, each at its worst confirmed layer."""
    entries: list[FailureEntry] = []
    analysis = load_analysis(parent)
    for case_id in analysis.failing:
        before, rerun = evidence(first.get(case_id)), evidence(again.get(case_id))
        if before is None or rerun is None:
            continue
        for layer in failed_layers(first[case_id]):  # the alert's kind follows the layer that was confirmed
            confirmed_by = confirmation(before, rerun, layer)
            if confirmed_by is None:
                continue
            found = superseding(entry(first[case_id], layer), analysis)
            found["confirmed_by"] = confirmed_by
            found["confirmation_log_e_value"] = again[case_id].log_e_value
            found["confirmation_verdict"] = again[case_id].verdict.value
            replay = (again[case_id].details or {}).get("replay")
            if confirmed_by == REPLAYED and isinstance(replay, dict) and found["reason"] != RAISED:
                found["replay"] = f"seed {replay.get('seed')}: {str(replay.get('reason', ''))[:300]}"
            entries.append(found)
            break
    return entries


def _standing_at(session: Session, run: Run) -> dict[tuple[str, str], list[Signature | None]]:
    """The failures the branch's alerts stand for at ``run``'s commit, now: begun at or before it and not resolved,
    or resolved by a later commit (an alert that opened after this commit's own analysis may already be resolved by
    a commit after it: at this commit it stood all the same), with the signatures their entries recorded."""
    order = run.commit.branch_order or 0
    spans = failure_alert_spans(session, run.commit)
    return signatures_of(
        alert for alert, began, ended in spans if began <= order and (alert.state is not AlertState.resolved or (ended or 0) > order)
    )


def _against_alerts_now(entries: list[FailureEntry], known: dict[tuple[str, str], list[Signature | None]]) -> list[FailureEntry]:
    """``entries`` triaged again against the alerts that stand at the parent's commit now. The parent's triage saw
    the alerts of its own analysis; an alert opened since (the confirmation of an earlier commit's failure, analysed
    after this commit's primary run) may already stand for a case. A case it stands for with the same signature is
    its failure (dropped: nothing new here); with another signature it is a new failure of that case, which
    ``supersedes`` the standing one (its search then treats commits failing the old way as good)."""
    kept: list[FailureEntry] = []
    for found in entries:
        standing = known.get((found["case_id"], found["reason"]))
        mine = found.get("signature")
        if not standing or "supersedes" in found:
            kept.append(found)
        elif isinstance(mine, dict) and all(old is not None and signatures_differ(Signature.from_dict(mine), old) for old in standing):
            last = standing[-1]
            assert last is not None
            found["supersedes"] = last.as_dict()
            kept.append(found)
        else:
            log.info("failure_alerted_meanwhile case_id=%s reason=%s", found["case_id"], found["reason"])
    return kept


def analyse_confirmation(ctx: Analysis, run: Run, cases: dict[str, CaseResult], analysis: RunAnalysis) -> None:
    """Confirm the parent's failing cases with ``run`` (its confirmation); confirmed ones are bisected."""
    session = ctx.session
    parent = lock_run(session, run.parent_run_id) if run.parent_run_id is not None else None
    if parent is None:
        analysis.confirmed = False
        return
    entries = _against_alerts_now(_confirmed_entries(parent, load_cases(session, parent.id), cases), _standing_at(session, parent))
    analysis.confirmed = [e["case_id"] for e in entries]
    parent_analysis = load_analysis(parent)
    if entries or parent_analysis.known_failing:  # a known failure still fails the commit
        status = "confirmed" if entries else "failure"
    else:
        status = "unconfirmable" if run.status in (RunStatus.error, RunStatus.uninstallable) else "not-confirmed"
    ctx.report.notifications += queue_commit_status(session, ctx.config.notify, parent, status)
    if not entries:
        log.info("failure_not_confirmed run_id=%s confirmation_run_id=%s", parent.id, run.id)
        return
    reasons = {e["reason"] for e in entries}
    kind = AlertKind.violation if LOSSLESS in reasons else AlertKind.exception if RAISED in reasons else AlertKind.performance
    analysis.confirmed_kind = kind
    start_bisection(ctx, parent, kind, entries, parent_analysis, confirmation=run)
