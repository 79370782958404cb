"""Pip-mode runs end to end: the release poller finds a release on a local index, ``workers.run_suite`` has the
suite ``pip install`` that release (a real wheel of the toy sampler, served over HTTP) and test it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.models import CaseResult, CommitPolicy, InstallMode, RunStatus, Verdict
from tests.support.package_index import PackageIndex, build_wheel, serve
from tests.support.pollers import add_target, runs, time_passes
from tests.support.toy_target import CORRECT, SWAPPED_RESIDUAL
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
            env_passthrough='["PIP_INDEX_URL"]',
        )
        env["SPECWATCH_RUN_PROFILE"] = "smoke"
        monkeypatch.setenv("PIP_INDEX_URL", f"{served.url}/simple")
        flush_redis()
        with configured(monkeypatch, env):
            yield served
        flush_redis()


def toy_wheel(dest: Path, version: str, sampler: str) -> Path:
    return build_wheel(dest, "toy-lib", version, {"toy_lib/__init__.py": '"""toy_lib, released."""\n', "toy_lib/sampler.py": sampler})


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
    assert verdicts(factory, good_run) == dict.fromkeys(SMOKE_CASES, Verdict.pass_)
    assert verdicts(factory, bad_run) == dict.fromkeys(SMOKE_CASES, Verdict.fail)
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
