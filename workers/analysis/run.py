"""The analysis of one finished run: lock it, classify it, hand it to its purpose's step, record the decision.

:func:`analyse` is the domain function behind ``workers.analyse_run``. It is idempotent: a run is analysed
once (``analysed_at`` under the run's row lock). It flushes; the task commits and then enqueues the runs it
queued (``report.queued``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import FINISHED_STATUSES, Run, RunPurpose
from workers.analysis.bisection import continue_bisection
from workers.analysis.confirmation import analyse_confirmation
from workers.analysis.context import Analysis, AnalysisConfig, AnalysisReport, load_cases, lock_run
from workers.analysis.decisions import classify
from workers.analysis.fixes import continue_fix_searches
from workers.analysis.primary import analyse_primary
from workers.analysis.state import RunAnalysis, store_analysis
from workers.analysis.triage import case_outcomes

log = logging.getLogger(__name__)


def analyse(session: Session, run_id: int, *, config: AnalysisConfig, now: datetime) -> AnalysisReport:
    """Analyse finished run ``run_id`` once; the caller commits, then enqueues ``report.queued``."""
    run = lock_run(session, run_id)
    if run is None:
        return AnalysisReport(run_id, "skipped", "no such run")
    if run.analysed_at is not None:
        return AnalysisReport(run_id, "skipped", "already analysed")
    if run.status not in FINISHED_STATUSES:
        return AnalysisReport(run_id, "skipped", f"run is {run.status.value}")
    report = AnalysisReport(run_id, "analysed")
    cases = load_cases(session, run.id)
    kind, failing = classify(run.status.value, case_outcomes(cases))
    report.kind = kind.value if kind else None
    analysis = RunAnalysis(kind=kind, failing=failing)
    ctx = Analysis(session, config, now, report)
    if run.purpose is RunPurpose.primary:
        analyse_primary(ctx, run, cases, analysis)
    elif run.purpose is RunPurpose.confirmation:
        analyse_confirmation(ctx, run, cases, analysis)
    else:
        continue_bisection(ctx, run)
        continue_fix_searches(ctx, run)
    store_analysis(run, analysis)
    run.analysed_at = now
    session.flush()
    log.info(
        "run_analysed run_id=%s purpose=%s kind=%s queued=%s opened=%s resolved=%s",
        run.id,
        run.purpose.value,
        report.kind,
        report.queued,
        report.opened,
        report.resolved,
    )
    return report


def unanalysed(session: Session, *, now: datetime, grace: timedelta, horizon: timedelta, limit: int = 200) -> list[int]:
    """Finished runs nobody analysed (their message was lost) within ``horizon``, finished over ``grace`` ago."""
    return list(
        session.scalars(
            select(Run.id)
            .where(
                Run.status.in_(FINISHED_STATUSES),
                Run.analysed_at.is_(None),
                Run.finished_at < now - grace,
                Run.finished_at > now - horizon,
            )
            .order_by(Run.id)
            .limit(limit)
        )
    )
