"""Pip-mode runs end to end: the release poller finds a release on a local index, ``workers.run_suite`` has the
suite ``pip install`` that release (a real wheel of the toy sampler, served over HTTP) and test it.

A release pip cannot install (a dependency the index lacks) is retried, then ``uninstallable`` with an alert of
that kind, resolved once a later release installs; one that installs but fails to import stays broken."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.exceptions import Retry
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.models import Alert, AlertKind, AlertState, CaseResult, CommitPolicy, InstallMode, RunStatus, Verdict
from tests.support.package_index import PackageIndex, build_wheel, serve
from tests.support.pollers import add_target, runs, time_passes
from tests.support.toy_target import BROKEN_IMPORT, CORRECT, SWAPPED_RESIDUAL
from tests.support.workers import add_runs, configured, flush_redis, worker_environment

# The module, not its tasks (see test_tasks.py).
from workers import tasks
from workers.execution import run_seed

pytestmark = pytest.mark.integration

SMOKE_CASES = {"direct/far_apart/V8/g1", "direct/far_apart/V8/g3"}


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, database_url: str) -> Iterator[PackageIndex]:
    """A local index; this process a worker whose suite installs releases from it (PIP_INDEX_URL passed through)."""
    with serve(PackageIndex()) as served:
        env = worker_environment(
            database_url,
            tmp_path,
            lease_s="30",
            heartbeat_s="1",
            pypi_url=served.url,
            release_cache_dir=str(tmp_path / "releases"),
            env_passthrough='["PIP_INDEX_URL", "PIP_RETRIES"]',
            # A release that cannot be installed: one retry, after a second (the countdown is Celery's here).
            install_retries="1",
            install_backoff_s="1",
            install_backoff_max_s="1",
        )
        env["SPECWATCH_RUN_PROFILE"] = "smoke"
        monkeypatch.setenv("PIP_INDEX_URL", f"{served.url}/simple")
        monkeypatch.setenv("PIP_RETRIES", "0")
        flush_redis()
        with configured(monkeypatch, env):
            yield served
        flush_redis()


def toy_wheel(dest: Path, version: str, sampler: str, requires: tuple[str, ...] = ()) -> Path:
    files = {"toy_lib/__init__.py": '"""toy_lib, released."""\n', "toy_lib/sampler.py": sampler}
    return build_wheel(dest, "toy-lib", version, files, requires)


def alerts_of(factory: sessionmaker[Session], target_id: int) -> list[Alert]:
    with factory() as session:
        found = list(session.scalars(select(Alert).where(Alert.target_id == target_id).order_by(Alert.id)))
        session.expunge_all()
        return found


def verdicts(factory: sessionmaker[Session], run_id: int) -> dict[str, Verdict]:
    with factory() as session:
        return {c.case_id: c.verdict for c in session.scalars(select(CaseResult).where(CaseResult.run_id == run_id))}


@pytest.mark.slow
def test_each_new_release_is_installed_with_pip_and_tested(factory: sessionmaker[Session], index: PackageIndex, tmp_path: Path) -> None:
    index.publish("toy-lib", "1.0", wheel=toy_wheel(tmp_path / "dist", "1.0", CORRECT))
    target_id = add_target(factory, "https://example.com/toy/toy-lib", name="toy-lib", install=InstallMode.pip, policy=CommitPolicy.every)

    (good_run,) = tasks.poll_releases()["runs"]
    assert tasks.run_suite(good_run)["status"] == "passed"

    index.publish("toy-lib", "1.1", wheel=toy_wheel(tmp_path / "dist", "1.1", SWAPPED_RESIDUAL))
    time_passes(factory)
    (bad_run,) = tasks.poll_releases()["runs"]
    assert tasks.run_suite(bad_run)["status"] == "failed"

    by_sha = runs(factory, target_id)
    assert [(sha, run.status) for sha, run in by_sha.items()] == [("release:1.0", RunStatus.passed), ("release:1.1", RunStatus.failed)]
    for sha, run in by_sha.items():
        assert run.library_version == sha.removeprefix("release:")
        assert run.seed == run_seed(sha)
        assert run.error is None
    assert verdicts(factory, good_run) == dict.fromkeys(SMOKE_CASES, Verdict.PASS)
    assert verdicts(factory, bad_run) == dict.fromkeys(SMOKE_CASES, Verdict.FAIL)
    # pip fetched each wheel from the local index into the worker's release cache, once per release.
    assert {"/files/toy_lib-1.0-py3-none-any.whl", "/files/toy_lib-1.1-py3-none-any.whl"} <= set(index.requests)
    installed = sorted(p.name for p in (tmp_path / "releases" / "pip").iterdir())
    assert installed == ["toy-lib__1.0", "toy-lib__1.1"]
    assert (tmp_path / "releases" / "pip" / "toy-lib__1.1" / "toy_lib" / "sampler.py").read_text() == SWAPPED_RESIDUAL
    assert list((tmp_path / "scratch").iterdir()) == []


def test_a_git_commit_of_a_pip_target_is_an_error_not_a_checkout(factory: sessionmaker[Session], index: PackageIndex) -> None:
    add_target(factory, "https://example.com/toy/toy-lib", name="toy-lib", install=InstallMode.pip)
    (run_id,) = add_runs(factory, "https://example.com/toy/toy-lib", ["a" * 40], adapter="toy_lib.sampler:speculative_sample")

    result = tasks.run_suite(run_id)

    assert result["status"] == "error"
    assert "is not a release" in result["reason"]
    assert index.requests == []


@pytest.mark.slow
def test_a_release_whose_dependency_is_missing_is_retried_then_uninstallable_never_broken(
    factory: sessionmaker[Session], index: PackageIndex, tmp_path: Path
) -> None:
    """transformers 5.25.0 on PyPI, in small: its dependency ``kernels>=0.19.1,<0.20`` is not on the index."""
    index.publish("toy-lib", "2.0", wheel=toy_wheel(tmp_path / "dist", "2.0", CORRECT, ("kernels>=0.19.1,<0.20",)))
    target_id = add_target(factory, "https://example.com/toy/toy-lib", name="toy-lib", install=InstallMode.pip, policy=CommitPolicy.every)
    (run_id,) = tasks.poll_releases()["runs"]

    with pytest.raises(Retry):  # called directly, the task's retry (countdown 1 s) raises
        tasks.run_suite(run_id)

    run = runs(factory, target_id)["release:2.0"]
    assert (run.status, run.attempt, run.install_failures) == (RunStatus.queued, 1, 1)
    assert run.error is not None
    assert run.error.startswith("could not install: kernels<0.20,>=0.19.1 (no distribution on the package index satisfies it")
    assert run.error.endswith("; attempt 1 of 2, next in 1 s")
    assert run.lease_expires_at is not None  # the sweeper's backstop, should the retry's message be lost

    assert tasks.run_suite(run_id)["status"] == "uninstallable"  # the retry: the failure persists

    run = runs(factory, target_id)["release:2.0"]
    assert (run.status, run.attempt, run.install_failures) == (RunStatus.uninstallable, 2, 2)
    assert run.error is not None
    assert "gave up after 2 attempts" in run.error
    report = tasks.analyse_run(run_id)
    assert (report["kind"], report["queued"]) == ("uninstallable", [])  # nothing to confirm or bisect
    (alert,) = alerts_of(factory, target_id)
    assert (alert.kind, alert.state, alert.confirmed) == (AlertKind.uninstallable, AlertState.open, False)
    assert alert.cases[0]["requirement"] == "kernels<0.20,>=0.19.1"
    assert alert.summary == "could not install toy-lib release:2.0: kernels<0.20,>=0.19.1"

    # The dependency appears on the index; the next release installs, passes and resolves the alert.
    index.publish("kernels", "0.19.2", wheel=build_wheel(tmp_path / "dist", "kernels", "0.19.2", {"kernels/__init__.py": ""}))
    index.publish("toy-lib", "2.1", wheel=toy_wheel(tmp_path / "dist", "2.1", CORRECT, ("kernels>=0.19.1,<0.20",)))
    time_passes(factory)
    (next_run,) = tasks.poll_releases()["runs"]
    assert tasks.run_suite(next_run)["status"] == "passed"
    assert tasks.analyse_run(next_run)["resolved"] == [alert.id]
    (alert,) = alerts_of(factory, target_id)
    assert alert.state is AlertState.resolved


@pytest.mark.slow
def test_a_release_that_installs_but_fails_to_import_stays_broken(
    factory: sessionmaker[Session], index: PackageIndex, tmp_path: Path
) -> None:
    index.publish("toy-lib", "3.0", wheel=toy_wheel(tmp_path / "dist", "3.0", BROKEN_IMPORT))
    target_id = add_target(factory, "https://example.com/toy/toy-lib", name="toy-lib", install=InstallMode.pip, policy=CommitPolicy.every)
    (run_id,) = tasks.poll_releases()["runs"]

    assert tasks.run_suite(run_id)["status"] == "error"  # no retry: pip installed it, importing it fails

    run = runs(factory, target_id)["release:3.0"]
    assert (run.status, run.attempt, run.install_failures) == (RunStatus.error, 1, 0)
    assert run.error is not None
    assert "exit 2, a broken commit or target" in run.error
    assert tasks.analyse_run(run_id)["kind"] == "broken"
    assert [a.kind for a in alerts_of(factory, target_id)] == [AlertKind.broken]
