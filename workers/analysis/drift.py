"""Acceptance drift: passing cases whose mean acceptance moved from their recent passing runs on the branch.

A drift is already rare at ``drift_alpha`` per run, so it is not confirmed; it is bisected like a failure
(:mod:`workers.analysis.bisection`) between the newest passing commit and this one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.history import earlier_runs
from service.models import CaseResult, Commit, Run, RunStatus, Verdict
from workers.analysis.context import AnalysisConfig
from workers.analysis.decisions import AcceptanceSample, acceptance_drift, case_gamma
from workers.analysis.triage import entry


def per_trial_max(case: CaseResult) -> int | None:
    """B with every trial's accepted drafts in [0, B]: what the suite reported, or for rows written before it
    reported one (result schema 2), the ``/gN`` of a chain step's case id (:func:`case_gamma`); None: unknown."""
    if case.acceptance_per_trial_max is not None:
        return case.acceptance_per_trial_max
    return case_gamma(case.case_id)


def _measured(cases: dict[str, CaseResult]) -> list[CaseResult]:
    """Passing cases with an acceptance rate over a known per-trial range."""
    return [
        c
        for c in cases.values()
        if c.verdict is Verdict.PASS
        and c.acceptance_observed is not None
        and c.n_trials
        and per_trial_max(c)
        and not c.case_id.startswith("edge/")  # deterministic paths, not samples of the acceptance rate
    ]


def drifting_cases(session: Session, run: Run, cases: dict[str, CaseResult], config: AnalysisConfig) -> list[dict[str, Any]]:
    """Alert entries (reason ``drift``) of the passing cases whose mean acceptance moved significantly.

    Each case is tested at ``drift_alpha / m`` (m: the run's cases with an acceptance rate over a known range),
    so the run's false-alarm rate for drift is at most ``drift_alpha`` (Bonferroni; Hoeffding bound per case
    over the range [0, B] of one trial's accepted drafts, :func:`per_trial_max`). The baseline is the case's
    passing rows among the last ``drift_baseline_runs`` passing runs whose B equals the current one: a run with
    another range (a case whose horizon changed) is not comparable, and the entry counts it in
    ``baseline_left_out``. The entry keeps its baseline, so a later commit can be measured against the same one
    (:func:`still_drifting`).
    """
    measured = _measured(cases)
    if not measured:
        return []
    alpha = config.drift_alpha / len(measured)
    passing = earlier_runs(run.commit, run.profile).where(Run.status == RunStatus.passed)
    found: list[dict[str, Any]] = []
    for case in measured:
        bound = per_trial_max(case)
        assert bound is not None
        rows = session.scalars(
            select(CaseResult)
            .join(Run, CaseResult.run_id == Run.id)
            .where(CaseResult.case_id == case.case_id, CaseResult.verdict == Verdict.PASS, Run.id.in_(passing.with_only_columns(Run.id)))
            .join(Commit, Run.commit_id == Commit.id)
            .order_by(Commit.branch_order.desc(), Run.id.desc())
            .limit(config.drift_baseline_runs)
        ).all()
        comparable = [r for r in rows if per_trial_max(r) == bound]
        baseline = [
            AcceptanceSample(r.acceptance_observed, r.n_trials, bound)
            for r in comparable
            if r.acceptance_observed is not None and r.n_trials
        ]
        current = AcceptanceSample(case.acceptance_observed or 0.0, case.n_trials or 0, bound)
        drift = acceptance_drift(current, baseline, alpha)
        if drift is None or not drift.significant:
            continue
        n_b = sum(b.trials for b in baseline)
        found.append(
            entry(case, "drift")
            | {
                "difference": drift.difference,
                "radius": drift.radius,
                "alpha": alpha,
                "baseline_mean": sum(b.mean * b.trials for b in baseline) / n_b,
                "baseline_trials": n_b,
                "baseline_runs": len(baseline),
                "baseline_left_out": len(rows) - len(comparable),
                "per_trial_max": bound,
            }
        )
    return found


def entry_per_trial_max(drift_entry: dict[str, Any]) -> int:
    """The range [0, B] a drift entry was measured over (entries written before ``per_trial_max`` say ``gamma``)."""
    return int(drift_entry["per_trial_max"] if "per_trial_max" in drift_entry else drift_entry["gamma"])


def still_drifting(drift_entry: dict[str, Any], case: CaseResult) -> bool:
    """Does ``case`` (a later run's) still drift from the baseline its alert entry measured it against?

    A case whose range changed since (another ``per_trial_max``) is not comparable with that baseline: it
    still counts as drifting, so neither a bisection nor a resolution concludes from it."""
    if case.acceptance_observed is None or not case.n_trials:
        return True
    bound = entry_per_trial_max(drift_entry)
    if per_trial_max(case) != bound:
        return True
    baseline = AcceptanceSample(float(drift_entry["baseline_mean"]), int(drift_entry["baseline_trials"]), bound)
    drift = acceptance_drift(
        AcceptanceSample(case.acceptance_observed, case.n_trials, baseline.gamma), [baseline], float(drift_entry["alpha"])
    )
    return drift is None or drift.significant
