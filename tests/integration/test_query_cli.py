"""``specwatch history``, ``runs show``, ``compare`` and ``alerts`` on real PostgreSQL over a seeded history."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from click.testing import Result
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from service.cli import app
from service.models import Run, RunStatus
from tests.support.history import CASES, FAILING_CASE, TARGET, Seeded, seed_history

pytestmark = pytest.mark.integration

runner = CliRunner()


@pytest.fixture
def seeded(rolled_back_factory: sessionmaker[Session]) -> Seeded:
    with rolled_back_factory() as session:
        made = seed_history(session)
        session.commit()
    return made


def specwatch(factory: sessionmaker[Session], *args: str) -> Result:
    return runner.invoke(app, list(args), obj=factory)


def test_history_table_marks_the_first_failing_commit(rolled_back_factory: sessionmaker[Session], seeded: Seeded) -> None:
    result = specwatch(rolled_back_factory, "history", TARGET)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "first failing" in line]
    assert len(lines) == 1
    assert seeded.shas[4][:12] in lines[0]


def test_history_json(rolled_back_factory: sessionmaker[Session], seeded: Seeded) -> None:
    result = specwatch(rolled_back_factory, "history", TARGET, "--json", "--limit", "3")
    assert result.exit_code == 0, result.output
    page = json.loads(result.stdout)
    assert [c["branch_order"] for c in page["commits"]] == [8, 7, 6]
    assert page["next_cursor"] == "6"
    assert {"sha", "status", "run_id", "first_failing", "failed_cases"} <= set(page["commits"][0])


def test_history_of_cases_by_glob(rolled_back_factory: sessionmaker[Session], seeded: Seeded) -> None:
    result = specwatch(rolled_back_factory, "history", TARGET, "--case", "direct/*", "--json")
    assert result.exit_code == 0, result.output
    histories = json.loads(result.stdout)
    assert [h["case_id"] for h in histories] == sorted(c for c in CASES if c.startswith("direct/"))
    failing = next(h for h in histories if h["case_id"] == FAILING_CASE)
    assert [p["verdict"] for p in failing["points"]] == ["pass", "pass", "pass", "fail", "fail", "pass"]
    table = specwatch(rolled_back_factory, "history", TARGET, "--case", FAILING_CASE)
    assert table.exit_code == 0, table.output
    assert FAILING_CASE in table.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["history", "nope"], "no target named 'nope'"),
        (["history", TARGET, "--branch", "nope"], "has no branch"),
        (["history", TARGET, "--case", "zzz*"], "no case"),
        (["runs", "show", "999999999"], "no run 999999999"),
        (["compare", "ffffffff", "eeeeeeee", "--target", TARGET], "has no commit"),
        (["compare", "ab", "cd", "--target", TARGET], "too short"),
        (["alerts", "ack", "999999999"], "no alert"),
    ],
)
def test_user_errors_exit_2(rolled_back_factory: sessionmaker[Session], seeded: Seeded, args: list[str], message: str) -> None:
    result = specwatch(rolled_back_factory, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_runs_show(rolled_back_factory: sessionmaker[Session], seeded: Seeded) -> None:
    table = specwatch(rolled_back_factory, "runs", "show", str(seeded.runs[5]))
    assert table.exit_code == 0, table.output
    assert all(case in table.output for case in CASES)
    assert f"vs run {seeded.runs[4]}" in table.output
    assert (table.output.count("unchanged"), table.output.count(" changed")) == (len(CASES), 0)
    as_json = json.loads(specwatch(rolled_back_factory, "runs", "show", str(seeded.runs[5]), "--json").stdout)
    assert (as_json["id"], as_json["status"], len(as_json["cases"])) == (seeded.runs[5], "failed", len(CASES))


def test_compare(rolled_back_factory: sessionmaker[Session], seeded: Seeded) -> None:
    result = specwatch(rolled_back_factory, "compare", seeded.shas[3][:8], seeded.shas[4], "--target", TARGET, "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    changed = [c["case_id"] for c in body["cases"] if c["changed"]]
    assert changed == [FAILING_CASE]
    table = specwatch(rolled_back_factory, "compare", seeded.shas[3], seeded.shas[4], "--target", TARGET)
    assert table.exit_code == 0, table.output
    assert "1 of 3 case(s) changed" in table.output


def test_alerts_list_ack_resolve(rolled_back_factory: sessionmaker[Session], seeded: Seeded) -> None:
    listed = json.loads(specwatch(rolled_back_factory, "alerts", "--state", "open", "--json").stdout)
    assert [a["id"] for a in listed] == [seeded.open_alert]
    assert specwatch(rolled_back_factory, "alerts").exit_code == 0
    acked = specwatch(rolled_back_factory, "alerts", "ack", str(seeded.open_alert))
    assert acked.exit_code == 0, acked.output
    assert f"alert {seeded.open_alert} is acknowledged" in acked.output
    resolved = json.loads(specwatch(rolled_back_factory, "alerts", "resolve", str(seeded.open_alert), "--json").stdout)
    assert resolved["state"] == "resolved"
    again = specwatch(rolled_back_factory, "alerts", "ack", str(seeded.open_alert))
    assert again.exit_code == 2
    assert "only an open alert" in again.output


def test_rerun_records_the_reason_and_leaves_the_run_due_for_the_sweeper(
    rolled_back_factory: sessionmaker[Session], seeded: Seeded
) -> None:
    """``specwatch rerun`` (issue 26): a new primary run of the commit with the reason and who asked; the command
    cannot reach ``specwatch serve``'s in-process queue, so the run is due at once for the workers' sweeper."""
    result = specwatch(rolled_back_factory, "rerun", TARGET, seeded.shas[6][:8], "--reason", "flaky worker", "--json")
    assert result.exit_code == 0, result.output
    done = json.loads(result.stdout)
    assert (done["sha"], done["reason"]) == (seeded.shas[6], "flaky worker")
    assert done["requested_by"].startswith("cli:")
    with rolled_back_factory() as session:
        run = session.get(Run, done["run_id"])
        assert run is not None
        assert (run.status, run.rerun_reason, run.seed_attempt) == (RunStatus.queued, "flaky worker", 0)
        assert run.lease_expires_at is not None
        assert run.lease_expires_at <= datetime.now(UTC)
    again = specwatch(rolled_back_factory, "rerun", TARGET, seeded.shas[6][:8], "--reason", "again")
    assert again.exit_code == 2
    assert "still queued or running" in again.output
    assert specwatch(rolled_back_factory, "rerun", TARGET, seeded.shas[6][:8], "--reason", " ").exit_code == 2
    assert specwatch(rolled_back_factory, "rerun", TARGET, "feedbeef", "--reason", "x").exit_code == 2
    shown = specwatch(rolled_back_factory, "history", TARGET)
    assert shown.exit_code == 0, shown.output
    assert "flaky worker" in shown.stdout
    assert "re-run by cli:" in shown.stdout
    listed = specwatch(rolled_back_factory, "targets", "list")
    assert listed.exit_code == 0, listed.output
    assert "2 queued (oldest" in " ".join(listed.stdout.split())
    [row] = json.loads(specwatch(rolled_back_factory, "targets", "list", "--json").stdout)
    assert (row["queued_runs"], row["last_run"]["status"]) == (2, "passed")
