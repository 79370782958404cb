"""GitHub check runs (issue 26, Build 5): a target that opts in gets, besides the commit status, a check run with the
run's report (failing cases, known findings linked on the dashboard, the command that reproduces it), sent through
the outbox to a local HTTP server that refuses what GitHub would (422).

The run's results are real: the suite runs once here (the swapped-residual mutant, two failing cases) and its result
is stored as the worker stores it (case rows and the result header). The report rebuilt from the database must be
the one ``specwatch check --markdown`` writes from the suite's own result.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from service.cli import app as cli
from service.db import session_scope
from service.findings import add_finding
from service.models import CaseResult, Commit, Notification, NotificationChannel, NotificationStatus, Run, RunStatus, Target
from service.notifications.check_runs import OUTPUT_TEXT_MAX, reproduce_command, stored_result
from service.notifications.github import queue_commit_status
from service.notifications.outbox import NotifyConfig
from specwatch.cases import select as select_cases
from specwatch.protocol import RunResult
from specwatch.report import KnownFinding, markdown_report
from specwatch.runner import SuiteConfig, run_suite
from specwatch.sampling import reference_sampler
from tests.support.http_fakes import fake_server
from workers.case_rows import case_result_row
from workers.notify import deliver_due
from workers.senders import Channels

TOKEN = "ghs_app-installation-token"
DASHBOARD = "https://specwatch.example.com"
SUITE_ARGS = ["--quick", "--cases", "direct/far_apart/V8/*"]
KNOWN_CASE = "direct/far_apart/V8/g1"
FINDINGS = f"{DASHBOARD}/ui/targets/lib/findings"


@pytest.fixture(scope="module")
def suite_result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real run of the suite against the swapped-residual mutant (two failing cases), as its result file."""
    path = tmp_path_factory.mktemp("suite") / "result.json"
    command = [sys.executable, "-m", "specwatch", "run", "--target", "mutant:swapped_residual", "--seed", "7", "--json", str(path)]
    done = subprocess.run(
        [*command, *SUITE_ARGS], check=False, capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    )
    assert done.returncode == 1, done.stderr
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def _stored_run(session: Session, result: dict[str, Any], *, checks: bool = True, name: str = "lib") -> Run:
    target = Target(name=name, repo_url=f"https://github.com/acme/{name}.git", adapter="x", branches=["main"], github_checks=checks)
    run = Run(commit=Commit(target=target, sha="b" * 40, branch="main", branch_order=1), profile="quick", status=RunStatus.failed, seed=7)
    session.add(run)
    session.flush()
    suite = RunResult.from_json(result)
    session.add_all(case_result_row(run.id, case) for case in suite.results)
    run.result_header = {"run": {k: v for k, v in result.items() if k != "results"}, "suite_args": SUITE_ARGS}
    session.flush()
    return run


def _channels(url: str) -> Channels:
    return Channels(slack_webhook_url=None, github_token=TOKEN, github_api_url=url, backoff_s=1)


def test_a_failing_run_posts_its_report_as_a_check_run(backend_factory: sessionmaker[Session], suite_result: dict[str, Any]) -> None:
    config = NotifyConfig(github=True, dashboard_url=DASHBOARD)
    with session_scope(backend_factory) as session:
        run = _stored_run(session, suite_result)
        add_finding(session, "lib", {"key": "g1", "title": "The g1 case [fails]", "cases": [KNOWN_CASE], "link": "https://example.org/1"})
        assert queue_commit_status(session, config, run, "confirming") == 1  # a pending status: no check run yet
        assert queue_commit_status(session, config, run, "known") == 2  # the status and the check run
        run_id = run.id
        rows = list(session.scalars(select(CaseResult).where(CaseResult.run_id == run_id)))
        rebuilt = stored_result(run, rows)
        command = reproduce_command(run.commit.target, run)
    with fake_server([(201, {})], check_github_checks=True) as github:
        deliver_due(backend_factory, _channels(github.url), now=lambda: datetime(2026, 1, 1, tzinfo=UTC), limit=10)

    (check,) = [r for r in github.requests if r.path.endswith("/check-runs")]
    assert (check.path, check.status) == ("/repos/acme/lib/check-runs", 201)
    assert check.headers["Authorization"] == f"Bearer {TOKEN}"
    body = check.body
    assert (body["name"], body["head_sha"], body["status"], body["conclusion"]) == ("specwatch/quick", "b" * 40, "completed", "failure")
    assert body["details_url"] == f"{DASHBOARD}/ui/runs/{run_id}"
    output = body["output"]
    assert output["title"] == "specwatch: 2 of 2 case(s) fail, 1 of them known finding(s)"
    assert f"- [The g1 case \\[fails\\]]({FINDINGS}#finding-g1)" in output["summary"]  # a user's title stays text
    assert f"git -C checkout checkout {'b' * 40}" in output["summary"]
    # The text is the library's --markdown report of the same result, each known finding linked absolutely.
    original = RunResult.from_json(suite_result)

    class Link:
        key, title, link = "g1", "The g1 case [fails]", "https://example.org/1"

    def url_of(finding: KnownFinding) -> str:
        return f"{FINDINGS}#finding-{finding.key}"

    assert output["text"] == markdown_report(original, {KNOWN_CASE: Link()}, command, url_of=url_of)
    assert rebuilt is not None
    assert [(c.case_id, c.verdict, c.log_e_value, c.tv_ci) for c in rebuilt.results] == [
        (c.case_id, c.verdict, c.log_e_value, c.tv_ci) for c in original.results
    ]
    assert f"known: [The g1 case \\[fails\\]]({FINDINGS}#finding-g1)" in output["text"]
    assert "| new |" in output["text"]
    assert "specwatch check --target x --source checkout --seed 7 --quick --cases 'direct/far_apart/V8/*'" in output["text"]
    with backend_factory() as session:
        sent = session.scalars(select(Notification.status).where(Notification.channel == NotificationChannel.github_check)).all()
    assert sent == [NotificationStatus.sent]


def test_a_report_over_githubs_limit_is_cut_visibly(backend_factory: sessionmaker[Session], suite_result: dict[str, Any]) -> None:
    with session_scope(backend_factory) as session:
        run = _stored_run(session, suite_result)
        for case in session.scalars(select(CaseResult).where(CaseResult.run_id == run.id)):
            case.details = case.details | {"reason": "x" * 70_000}  # from the code under test: one long line
        assert queue_commit_status(session, NotifyConfig(github=True, dashboard_url=DASHBOARD), run, "failure") == 2
        run_id = run.id
    with fake_server([(201, {})], check_github_checks=True) as github:
        deliver_due(backend_factory, _channels(github.url), now=lambda: datetime(2026, 1, 1, tzinfo=UTC), limit=10)
    (check,) = [r for r in github.requests if r.path.endswith("/check-runs")]
    assert check.status == 201  # GitHub would have refused 65536 characters with a 422
    text = check.body["output"]["text"]
    assert len(text) <= OUTPUT_TEXT_MAX
    assert text.endswith(f"the whole run is on the dashboard: {DASHBOARD}/ui/runs/{run_id}\n")


def test_check_runs_use_their_own_token_when_set(backend_factory: sessionmaker[Session], suite_result: dict[str, Any]) -> None:
    """SPECWATCH_GITHUB_CHECKS_TOKEN (an App's installation token) posts the check run; the status keeps its token."""
    with session_scope(backend_factory) as session:
        run = _stored_run(session, suite_result)
        assert queue_commit_status(session, NotifyConfig(github=True, dashboard_url=DASHBOARD), run, "failure") == 2
    channels = Channels(slack_webhook_url=None, github_token="ghp_status", github_checks_token=TOKEN, backoff_s=1)
    with fake_server([(201, {})], check_github_checks=True) as github:
        deliver_due(backend_factory, replace(channels, github_api_url=github.url), now=lambda: datetime(2026, 1, 1, tzinfo=UTC), limit=10)
    tokens = sorted((r.path, r.headers["Authorization"], r.status) for r in github.requests)
    assert tokens == [
        ("/repos/acme/lib/check-runs", f"Bearer {TOKEN}", 201),
        (f"/repos/acme/lib/statuses/{'b' * 40}", "Bearer ghp_status", 201),
    ]
    assert channels.scrub(f"echo {TOKEN}") == "echo [secret]"


def test_no_check_run_unless_the_target_opted_in(backend_factory: sessionmaker[Session], suite_result: dict[str, Any]) -> None:
    with session_scope(backend_factory) as session:
        run = _stored_run(session, suite_result, checks=False, name="quiet")
        assert queue_commit_status(session, NotifyConfig(github=True), run, "failure") == 1
        channels = session.scalars(select(Notification.channel)).all()
    assert channels == [NotificationChannel.github]


def test_the_cli_turns_check_runs_on_and_off(factory: sessionmaker[Session], tmp_path: Path) -> None:
    runner = CliRunner()
    repo = tmp_path / "lib"
    subprocess.run(["git", "init", "--quiet", str(repo)], check=True)
    added = runner.invoke(
        cli,
        [
            "targets",
            "add",
            "optin",
            "--repo",
            str(repo),
            "--branch",
            "main",
            "--adapter",
            "toy_lib.sampler:speculative_sample",
            "--install",
            "source",
            "--github-checks",
        ],
        obj=factory,
    )
    assert added.exit_code == 0, added.output
    listed = runner.invoke(cli, ["targets", "list", "--json"], obj=factory)
    assert [t["github_checks"] for t in json.loads(listed.stdout) if t["name"] == "optin"] == [True]
    off = runner.invoke(cli, ["targets", "update", "optin", "--no-github-checks"], obj=factory)
    assert off.exit_code == 0, off.output
    assert "GitHub check runs off" in off.output
    with factory() as session:
        assert session.scalars(select(Target.github_checks).where(Target.name == "optin")).one() is False
    nothing = runner.invoke(cli, ["targets", "update", "optin"], obj=factory)
    assert nothing.exit_code == 2
    missing = runner.invoke(cli, ["targets", "update", "nosuch", "--github-checks"], obj=factory)
    assert missing.exit_code == 2
    runner.invoke(cli, ["targets", "remove", "optin"], obj=factory)


def test_an_early_pass_is_stored_and_rebuilt(backend_factory: sessionmaker[Session]) -> None:
    """A case that stopped on an early pass keeps it through the database: the case's flag and threshold (``details``),
    each check's pass statistic and trials, and the run's beta_pass (the header)."""
    suite = run_suite(select_cases([KNOWN_CASE]), reference_sampler, SuiteConfig(seed=7))
    result: dict[str, Any] = json.loads(json.dumps(suite.to_dict(), allow_nan=False))
    with session_scope(backend_factory) as session:
        run = _stored_run(session, result, name="early")
        rebuilt = stored_result(run, list(session.scalars(select(CaseResult).where(CaseResult.run_id == run.id))))
    assert rebuilt is not None
    (case,), (original,) = rebuilt.results, suite.results
    assert (case.early_pass, case.pass_threshold, rebuilt.early_pass_beta) == (True, original.pass_threshold, 1e-3)
    assert case.n_trials < case.trial_cap
    passes = [(c.name, c.passed_at, c.pass_log_statistic) for c in case.checks]
    assert passes == [(c.name, c.passed_at, c.pass_log_statistic) for c in original.checks]
    assert any(passed_at is not None for _, passed_at, _ in passes)
    # Schema 7: why the case stopped, and each designed check's planned observations.
    assert case.stopped_by == original.stopped_by == "checks_done"
    planned = [(c.planned_observations, c.planned_at) for c in case.checks]
    assert planned == [(c.planned_observations, c.planned_at) for c in original.checks]
