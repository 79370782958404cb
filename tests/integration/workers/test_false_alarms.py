"""200 clean commits raise no alert: the analysis over 200 stored runs of the reference sampler.

Each run is the real suite (the ``smoke`` profile's cases: the two V8 direct cases at TV >= 0.1), executed
in this process with ``specwatch.runner.run_suite`` under each commit's own seed (the seed a worker
would use), stored as a worker stores it (:func:`workers.runs.record_outcome`) and analysed by
``workers.analyse_run`` in branch order: classification, confirmation, acceptance drift against the last 5
passing runs, resolution. 200 full worker round trips (checkout + subprocess) would cost ~15 minutes for
no extra coverage of the analysis; this costs ~30 s. Expected false alarms: per commit at most
alpha = 1e-4 (suite) + 1e-4 (drift), so about 0.04 over 200 commits.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from datetime import UTC, datetime

import pytest
import torch
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.models import Alert, Commit, Run, RunStatus, Target
from specwatch.cases import select as select_cases
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets.loader import resolve
from workers import tasks
from workers.execution import run_seed
from workers.profiles import get_profile
from workers.runs import RunOutcome, claim_run, record_outcome

pytestmark = [pytest.mark.usefixtures("worker_env"), pytest.mark.slow]

COMMITS = 200


def test_200_clean_commits_raise_no_alert(factory: sessionmaker[Session]) -> None:
    torch.set_num_threads(1)
    reference = resolve("reference")
    profile = get_profile("smoke")
    globs = [profile.suite_args[profile.suite_args.index("--cases") + 1]]
    cases = tuple(select_cases(globs, reference.cases))
    shas = [hashlib.sha1(f"clean-{i}".encode()).hexdigest() for i in range(COMMITS)]
    with session_scope(factory) as session:
        target = Target(name="clean", repo_url="https://github.com/acme/clean", adapter="reference", branches=["main"])
        runs = [
            Run(commit=Commit(target=target, sha=sha, branch="main", branch_order=i + 1), profile="smoke") for i, sha in enumerate(shas)
        ]
        session.add_all(runs)
        session.flush()
        run_ids = [r.id for r in runs]

    failed_runs = 0
    confirmations = 0
    for run_id, sha in zip(run_ids, shas, strict=True):
        result = run_suite(cases, reference.sampler, SuiteConfig(quick=True, seed=run_seed(sha)))
        status = RunStatus.passed if result.verdict.value == "pass" else RunStatus.failed
        failed_runs += status is RunStatus.failed
        with session_scope(factory) as session:
            claim_run(session, run_id, worker="test:1", now=datetime.now(UTC), lease_s=60)
            outcome = RunOutcome(status, seed=run_seed(sha), cases=result.results)
            assert record_outcome(session, run_id, 1, outcome, now=datetime.now(UTC))
        report = tasks.analyse_run(run_id)
        assert report["outcome"] == "analysed"
        confirmations += len(report["queued"])

    with factory() as session:
        alerts = session.scalar(select(func.count()).select_from(Alert))
        drift_checked = session.scalar(select(func.count()).select_from(Run).where(Run.analysed_at.is_not(None)))
    print(f"false alarms: {COMMITS} clean commits, {failed_runs} failing runs, {confirmations} confirmations, {alerts} alerts")
    assert drift_checked == COMMITS
    assert alerts == 0
    assert asdict(SuiteConfig())["alpha"] == 1e-4
