"""Acceptance drift over stored runs (no suite executed): end-to-end cases are covered by their reported range.

An end-to-end trial is a whole generate() call: its accepted drafts lie in [0, B] with B the suite's
``acceptance.per_trial_max`` (horizon - 1), stored in ``case_results.acceptance_per_trial_max``. The runs here
hold what such trials give: per trial, verification steps of ``GAMMA`` drafts over the output indices 1 .. 11
of a 12-token horizon (vLLM's layout), each draft accepted with probability ``accept`` until the first
rejection. A vLLM CPU kernel bug once took that case from about 7 accepted drafts per trial to about 1.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from service.app import create_app
from service.cli import app
from service.db import session_scope
from service.models import Alert, AlertKind, CaseResult, Commit, Run, RunStatus, Target, Verdict
from service.notifications.slack import slack_message
from service.settings import Settings
from tests.support.history import branch_commits
from workers.analysis import AnalysisConfig, analyse
from workers.analysis.drift import still_drifting
from workers.analysis.state import load_analysis

E2E = "e2e/draft_model/plain"
DIRECT = "direct/far_apart/V8/g3"
HORIZON, GAMMA = 12, 3
CONFIG = AnalysisConfig(confirm_failures=False)
TRIALS = 400
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def e2e_mean(rng: np.random.Generator, accept: float, trials: int = TRIALS, horizon: int = HORIZON) -> float:
    """Mean accepted drafts per trial of ``trials`` simulated requests (module docstring)."""
    total = 0
    for _ in range(trials):
        index = 1  # index 0 is the prefill's token
        while index < horizon:
            accepted = 0
            while accepted < GAMMA and rng.random() < accept:
                accepted += 1
            total += min(accepted, horizon - index)
            index += accepted + 1
    return total / trials


def _run(session: Session, commit: Commit, case_id: str, acceptance: float, bound: int | None) -> int:
    """A passing run of ``commit`` with one case of mean acceptance ``acceptance`` over the range [0, ``bound``]."""
    run = Run(commit=commit, profile="quick", status=RunStatus.passed)
    session.add(run)
    session.flush()
    session.add(
        CaseResult(
            run_id=run.id,
            case_id=case_id,
            verdict=Verdict.PASS,
            lossless=True,
            conformance=True,
            n_trials=TRIALS,
            e_value=1.0,
            log_e_value=0.0,
            threshold=1e4,
            acceptance_observed=acceptance,
            acceptance_per_trial_max=bound,
        )
    )
    session.flush()
    return run.id


def _history(session: Session, name: str, runs: list[tuple[str, float, int | None]]) -> tuple[list[Commit], list[Alert]]:
    """Commits 1.. in branch order, one analysed run each (case id, acceptance, bound); the alerts they opened."""
    commits = branch_commits(session, name, len(runs))
    for commit, (case_id, acceptance, bound) in zip(commits, runs, strict=True):
        analyse(session, _run(session, commit, case_id, acceptance, bound), config=CONFIG, now=NOW)
    return commits, list(session.scalars(select(Alert).join(Target).where(Target.name == name).order_by(Alert.id)))


def test_an_end_to_end_case_whose_acceptance_drops_is_flagged(rolled_back_factory: sessionmaker[Session]) -> None:
    """Flagged, bisected to its commit, and every place that shows the alert says the range the test used."""
    rng = np.random.default_rng(7)
    bound = HORIZON - 1
    baseline = [e2e_mean(rng, 0.9) for _ in range(5)]
    dropped = e2e_mean(rng, 0.1)
    assert min(baseline) > 6.5
    assert dropped < 1.5  # what the kernel bug did: about 7 to about 1
    with session_scope(rolled_back_factory) as session:
        commits, alerts = _history(session, "e2e-drop", [(E2E, a, bound) for a in [*baseline, dropped]])
        (alert,) = alerts
        assert (alert.kind, alert.first_bad_commit_id, alert.confirmed) == (AlertKind.performance, commits[-1].id, False)
        (found,) = alert.cases
        assert (found["case_id"], found["reason"], found["per_trial_max"]) == (E2E, "drift", bound)
        assert (found["baseline_runs"], found["baseline_left_out"], found["baseline_trials"]) == (5, 0, 5 * TRIALS)
        assert found["difference"] < -found["radius"] < 0
        alert_id = alert.id
        slack = str(slack_message(alert, "opened", "https://specwatch.example.com"))
    shown = f"per-trial range [0, {bound}]"
    assert shown in slack
    settings = Settings(env="test", database_url="postgresql+psycopg://unused", webhook_secret=SecretStr("x"))
    client = TestClient(create_app(settings, session_factory=rolled_back_factory))
    page = client.get(f"/ui/alerts/{alert_id}")
    assert page.status_code == 200
    assert shown in page.text
    listed = CliRunner().invoke(app, ["alerts", "--target", "e2e-drop"], obj=rolled_back_factory, terminal_width=400)
    assert listed.exit_code == 0, listed.output
    assert shown in " ".join(listed.output.split())


def test_an_end_to_end_case_whose_acceptance_is_stable_is_not_flagged(backend_factory: sessionmaker[Session]) -> None:
    rng = np.random.default_rng(8)
    with session_scope(backend_factory) as session:
        _, alerts = _history(session, "e2e-stable", [(E2E, e2e_mean(rng, 0.9), HORIZON - 1) for _ in range(8)])
        assert alerts == []
        runs = session.scalars(select(Run).join(Commit).join(Target).where(Target.name == "e2e-stable")).all()
        assert len(runs) == 8
        assert [load_analysis(r).drift for r in runs] == [[]] * 8


def test_runs_over_another_range_are_left_out_of_the_baseline(backend_factory: sessionmaker[Session]) -> None:
    """The horizon changed between commits 3 and 4 (range [0, 9], then [0, 11]): commit 6 is measured against
    commits 4 and 5 only, and its entry says that three runs were left out."""
    rng = np.random.default_rng(9)
    old = [(E2E, e2e_mean(rng, 0.9, horizon=10), 9) for _ in range(3)]
    new = [(E2E, e2e_mean(rng, 0.9), HORIZON - 1) for _ in range(2)]
    with session_scope(backend_factory) as session:
        _, (alert,) = _history(session, "e2e-horizon", [*old, *new, (E2E, e2e_mean(rng, 0.1), HORIZON - 1)])
        (found,) = alert.cases
        assert (found["baseline_runs"], found["baseline_left_out"], found["per_trial_max"]) == (2, 3, HORIZON - 1)


def test_a_case_with_no_baseline_over_its_range_is_not_tested(backend_factory: sessionmaker[Session]) -> None:
    """Earlier runs over another range only (or rows from before the range was reported, whose e2e id names no
    gamma): nothing comparable, so no drift, however far the acceptance moved."""
    rng = np.random.default_rng(10)
    earlier = [(E2E, e2e_mean(rng, 0.9, horizon=10), 9), (E2E, e2e_mean(rng, 0.9), None)]
    with session_scope(backend_factory) as session:
        _, alerts = _history(session, "e2e-incomparable", [*earlier, (E2E, e2e_mean(rng, 0.1), HORIZON - 1)])
        assert alerts == []


def test_rows_without_a_reported_range_fall_back_to_the_gamma_of_their_id(backend_factory: sessionmaker[Session]) -> None:
    """Direct-case rows stored before the range was reported (NULL) are comparable with new rows of range 3."""
    rng = np.random.default_rng(11)
    old = [(DIRECT, float(rng.binomial(3, 0.6, TRIALS).mean()), None) for _ in range(4)]
    drop = (DIRECT, float(rng.binomial(3, 0.3, TRIALS).mean()), 3)
    with session_scope(backend_factory) as session:
        _, (alert,) = _history(session, "direct-legacy", [*old, drop])
        (found,) = alert.cases
        assert (found["per_trial_max"], found["baseline_runs"], found["baseline_left_out"]) == (3, 4, 0)


def test_a_drift_entry_written_before_the_range_was_reported_is_still_measured() -> None:
    """Open alerts keep entries with ``gamma`` (no ``per_trial_max``); a later case of the same range is compared."""
    legacy = {"baseline_mean": 1.8, "baseline_trials": 2000, "gamma": 3, "alpha": 1e-4}
    recovered = CaseResult(case_id=DIRECT, n_trials=TRIALS, acceptance_observed=1.8, acceptance_per_trial_max=3)
    moved = CaseResult(case_id=DIRECT, n_trials=TRIALS, acceptance_observed=0.9, acceptance_per_trial_max=None)
    assert not still_drifting(legacy, recovered)
    assert still_drifting(legacy, moved)
    # Another range is not comparable with the entry's baseline: it does not count as recovered.
    assert still_drifting({**legacy, "per_trial_max": 11}, recovered)


def test_a_known_failure_inside_a_drift_search_is_not_its_first_bad_commit(backend_factory: sessionmaker[Session]) -> None:
    """Issue 42: commits 1-5 pass the case (the baseline), commit 6 fails it losslessly (an alert of its own),
    commit 7 is not tested, commit 8 passes it with a dropped acceptance. The drift search between 5 and 8 met
    commit 6's failure and called it bad, so the drift alert named commit 6, the other alert's commit. That
    failure is known there: commit 6 cannot tell, commit 7 is tested, and the drift is found where it began."""
    rng = np.random.default_rng(11)
    bound = HORIZON - 1
    baseline = [e2e_mean(rng, 0.9) for _ in range(5)]
    dropped = [e2e_mean(rng, 0.1) for _ in range(2)]
    with session_scope(backend_factory) as session:
        commits = branch_commits(session, "known-in-drift", 8)
        for commit, acceptance in zip(commits[:5], baseline, strict=True):
            analyse(session, _run(session, commit, E2E, acceptance, bound), config=CONFIG, now=NOW)
        broken = session.get(Run, _run(session, commits[5], E2E, baseline[0], bound))
        assert broken is not None
        broken.status = RunStatus.failed
        case = session.scalars(select(CaseResult).where(CaseResult.run_id == broken.id)).one()
        case.verdict, case.lossless, case.e_value, case.log_e_value = Verdict.FAIL, False, 1e9, 20.7
        session.flush()
        analyse(session, broken.id, config=CONFIG, now=NOW)
        (lossless,) = session.scalars(select(Alert).where(Alert.first_bad_commit_id == commits[5].id))
        assert lossless.kind is AlertKind.violation

        detected = _run(session, commits[7], E2E, dropped[0], bound)
        analyse(session, detected, config=CONFIG, now=NOW)
        midpoint = session.scalars(select(Run).where(Run.parent_run_id == detected)).one()  # commit 6 could not tell
        assert midpoint.commit_id == commits[6].id
        assert session.scalars(select(Alert).where(Alert.kind == AlertKind.performance)).all() == []
        midpoint.status = RunStatus.passed
        session.add(
            CaseResult(
                run_id=midpoint.id,
                case_id=E2E,
                verdict=Verdict.PASS,
                lossless=True,
                conformance=True,
                n_trials=TRIALS,
                e_value=1.0,
                log_e_value=0.0,
                threshold=1e4,
                acceptance_observed=dropped[1],
                acceptance_per_trial_max=bound,
            )
        )
        session.flush()
        analyse(session, midpoint.id, config=CONFIG, now=NOW)
        (drift,) = session.scalars(select(Alert).where(Alert.kind == AlertKind.performance))
        assert drift.first_bad_commit_id == commits[6].id
        assert drift.last_good_commit_id == commits[4].id
