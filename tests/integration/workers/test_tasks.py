"""workers.run_suite called directly (no eager mode): real PostgreSQL, real git checkouts, the real suite subprocess."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.models import CaseResult, Run, RunStatus, Verdict
from tests.support.toy_target import ADAPTER, BROKEN_IMPORT, CORRECT, SLOW, ToyRepo
from tests.support.workers import WEBHOOK_SECRET, add_runs, suite_case

# The module, not its tasks: pytest's collection would evaluate a task proxy, which configures the Celery app
# from this process's settings before the fixtures set them.
from workers import tasks
from workers.execution import run_seed
from workers.runs import RunOutcome, claim_run, record_outcome

pytestmark = pytest.mark.usefixtures("worker_env")

SMOKE_CASES = {"direct/far_apart/V8/g1", "direct/far_apart/V8/g3"}


def load(factory: sessionmaker[Session], run_id: int) -> Run:
    with factory() as session:
        run = session.get_one(Run, run_id)
        session.expunge(run)
        return run


def cases(factory: sessionmaker[Session], run_id: int) -> dict[str, CaseResult]:
    with factory() as session:
        return {c.case_id: c for c in session.scalars(select(CaseResult).where(CaseResult.run_id == run_id))}


@pytest.mark.slow
def test_pass_fail_pass_is_stored_per_commit(factory: sessionmaker[Session], toy_repo: ToyRepo, tmp_path: Path) -> None:
    shas = toy_repo.history()
    run_ids = add_runs(factory, toy_repo.url, shas, adapter=ADAPTER)

    statuses = [tasks.run_suite(run_id)["status"] for run_id in run_ids]

    assert statuses == ["passed", "failed", "passed"]
    for run_id, sha, verdict in zip(run_ids, shas, [Verdict.PASS, Verdict.FAIL, Verdict.PASS], strict=True):
        run = load(factory, run_id)
        assert run.attempt == 1
        assert run.finished_at is not None
        assert run.started_at is not None
        assert run.lease_expires_at is None
        assert run.worker_host
        assert run.device
        assert run.torch_version
        assert run.python_version
        assert run.library_version is None  # a module:function target records no library version (never a sha)
        assert run.seed == run_seed(sha)
        assert run.error is None
        results = cases(factory, run_id)
        assert set(results) == SMOKE_CASES
        assert {r.verdict for r in results.values()} == {verdict}
    bad = cases(factory, run_ids[1])["direct/far_apart/V8/g1"]
    assert bad.lossless is False
    assert bad.e_value is not None
    assert bad.threshold is not None
    assert bad.e_value >= bad.threshold
    assert bad.details["reason"].startswith("lossless")
    assert list((tmp_path / "scratch").iterdir()) == []  # scratch removed after every run


def test_a_second_call_is_a_no_op(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    (run_id,) = add_runs(factory, toy_repo.url, [toy_repo.commit(CORRECT, "good")], adapter=ADAPTER)
    assert tasks.run_suite(run_id)["status"] == "passed"
    finished = load(factory, run_id)

    again = tasks.run_suite(run_id)

    assert again == {"run_id": run_id, "status": "skipped", "reason": "already passed"}
    run = load(factory, run_id)
    assert (run.attempt, run.finished_at, run.status) == (1, finished.finished_at, RunStatus.passed)
    with factory() as session:
        assert session.scalar(select(func.count()).select_from(CaseResult).where(CaseResult.run_id == run_id)) == len(SMOKE_CASES)


def test_a_run_held_by_a_live_worker_is_left_alone(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    (run_id,) = add_runs(factory, toy_repo.url, [toy_repo.commit(CORRECT, "good")], adapter=ADAPTER)
    with session_scope(factory) as session:
        claim_run(session, run_id, worker="other-host:1", now=datetime.now(UTC), lease_s=600)

    result = tasks.run_suite(run_id)

    assert result["status"] == "skipped"
    assert "held by other-host:1" in result["reason"]
    assert load(factory, run_id).attempt == 1


def test_only_the_attempt_holding_the_run_stores_results(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    (run_id,) = add_runs(factory, toy_repo.url, [toy_repo.commit(CORRECT, "good")], adapter=ADAPTER)
    now = datetime.now(UTC)
    with session_scope(factory) as session:
        claim_run(session, run_id, worker="dead-host:1", now=now - timedelta(minutes=10), lease_s=60)
    with session_scope(factory) as session:  # its lease expired: a second worker takes over
        claim_run(session, run_id, worker="live-host:2", now=now, lease_s=60)

    case = "direct/far_apart/V8/g1"
    with session_scope(factory) as session:
        stale = record_outcome(session, run_id, 1, RunOutcome(RunStatus.failed, cases=(suite_case(case, "fail"),)), now=now)
    with session_scope(factory) as session:
        current = record_outcome(session, run_id, 2, RunOutcome(RunStatus.passed, cases=(suite_case(case, "pass"),)), now=now)

    assert (stale, current) == (False, True)
    assert load(factory, run_id).status == RunStatus.passed
    assert [c.verdict for c in cases(factory, run_id).values()] == [Verdict.PASS]


def test_a_broken_commit_is_an_error_with_its_stderr_not_a_violation(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    (run_id,) = add_runs(factory, toy_repo.url, [toy_repo.commit(BROKEN_IMPORT, "broken")], adapter=ADAPTER)

    assert tasks.run_suite(run_id)["status"] == "error"

    run = load(factory, run_id)
    assert run.status == RunStatus.error
    assert run.error is not None
    assert "could not test this commit (exit 2" in run.error
    assert "no_such_name_in_torch" in run.error
    assert run.log_tail is not None
    assert "cannot import 'toy_lib.sampler'" in run.log_tail
    assert cases(factory, run_id) == {}
    assert tasks.run_suite(run_id)["status"] == "skipped"


def test_a_run_over_its_time_limit_is_an_error_and_not_retried(
    monkeypatch: pytest.MonkeyPatch, factory: sessionmaker[Session], toy_repo: ToyRepo, tmp_path: Path
) -> None:
    from tests.support.workers import clear_caches

    monkeypatch.setenv("SPECWATCH_WORKER_SUITE_TIMEOUT_S", "4")
    clear_caches()
    (run_id,) = add_runs(factory, toy_repo.url, [toy_repo.commit(SLOW, "slow")], adapter=ADAPTER)

    assert tasks.run_suite(run_id)["status"] == "error"

    run = load(factory, run_id)
    assert run.error == "the suite exceeded its wall-clock limit of 4 s (profile smoke) and was killed"
    assert run.attempt == 1
    assert tasks.run_suite(run_id)["reason"] == "already error"
    assert list((tmp_path / "scratch").iterdir()) == []


ENV_MARK = "SUITE-ENVIRONMENT "
# The correct sampler, which first prints its environment and cwd on stderr (kept as the run's log tail): the
# sandbox lets it write nowhere outside its scratch directory.
ENV_DUMP = CORRECT.replace(
    "import torch\n",
    f"import json\nimport os\nimport sys\n\nimport torch\n\n"
    f"print({ENV_MARK!r} + json.dumps({{'env': dict(os.environ), 'cwd': os.getcwd()}}), file=sys.stderr, flush=True)\n",
    1,
)


def test_the_suite_runs_in_a_clean_environment(factory: sessionmaker[Session], toy_repo: ToyRepo, tmp_path: Path) -> None:
    (run_id,) = add_runs(factory, toy_repo.url, [toy_repo.commit(ENV_DUMP, "dump env")], adapter=ADAPTER)

    assert tasks.run_suite(run_id)["status"] == "passed"

    [line] = [line for line in (load(factory, run_id).log_tail or "").splitlines() if line.startswith(ENV_MARK)]
    seen = json.loads(line.removeprefix(ENV_MARK))
    env: dict[str, str] = seen["env"]
    assert not [name for name in env if name.startswith("SPECWATCH")]
    assert WEBHOOK_SECRET not in json.dumps(env)
    assert env["OMP_NUM_THREADS"] == "1"
    scratch = Path(seen["cwd"])
    assert scratch.parent == tmp_path / "scratch"
    assert Path(env["HOME"]).is_relative_to(scratch)
    python_path = env["PYTHONPATH"].split(":")
    assert python_path[0] == str(scratch / "checkout" / "src")
    assert set(env) <= {
        "PATH",
        "HOME",
        "TMPDIR",
        "LANG",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "PYTHONPATH",
        "PYTHONUNBUFFERED",
        "PYTHONNOUSERSITE",
        "CUDA_VISIBLE_DEVICES",
        "LC_CTYPE",
        "PWD",  # set by bubblewrap after it changes to the scratch directory
    }


def test_an_unknown_commit_is_an_error_with_a_clear_reason(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    toy_repo.commit(CORRECT, "good")
    missing = "f" * 40
    (run_id,) = add_runs(factory, toy_repo.url, [missing], adapter=ADAPTER)

    assert tasks.run_suite(run_id)["status"] == "error"

    assert (
        load(factory, run_id).error
        == f"checkout failed: commit {missing} does not exist in {toy_repo.url} (not found after fetching every ref)"
    )


def test_an_unknown_profile_is_an_error(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    (run_id,) = add_runs(factory, toy_repo.url, [toy_repo.commit(CORRECT, "good")], adapter=ADAPTER, profile="nightly")

    assert tasks.run_suite(run_id)["status"] == "error"

    assert load(factory, run_id).error == "unknown run profile 'nightly'; known: default, quick, smoke"


def test_a_missing_run_is_skipped() -> None:
    assert tasks.run_suite(123456) == {"run_id": 123456, "status": "skipped", "reason": "no such run"}
