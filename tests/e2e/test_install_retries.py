"""A real Celery worker retries a release it cannot install with a countdown, then alerts "uninstallable"."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.models import Alert, AlertKind, CommitPolicy, InstallMode, Run, RunStatus
from tests.e2e.conftest import WorkerProcess, wait_for
from tests.support.package_index import PackageIndex, build_wheel, serve
from tests.support.pollers import add_target
from tests.support.toy_target import CORRECT

# The module, not its tasks (see tests/integration/workers/test_tasks.py).
from workers import tasks

# A worker start and three attempts of a suite that installs: 30-60 s.
pytestmark = pytest.mark.slow


@pytest.fixture
def index() -> Iterator[PackageIndex]:
    with serve(PackageIndex()) as served:
        yield served


@pytest.fixture
def worker_timing(index: PackageIndex, tmp_path: Path) -> dict[str, str]:
    """Short leases, and a release that cannot be installed is retried twice, after 1 s then 2 s."""
    return {
        "lease_s": "3",
        "heartbeat_s": "1",
        "sweep_interval_s": "1",
        "install_retries": "2",
        "install_backoff_s": "1",
        "install_backoff_max_s": "2",
        "pypi_url": index.url,
        "release_cache_dir": str(tmp_path / "releases"),
        "env_passthrough": '["PIP_INDEX_URL", "PIP_RETRIES"]',
    }


def test_a_release_that_cannot_be_installed_is_retried_with_backoff_then_alerted_as_uninstallable(
    factory: sessionmaker[Session],
    index: PackageIndex,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    files = {"toy_lib/__init__.py": "", "toy_lib/sampler.py": CORRECT}
    index.publish("toy-lib", "2.0", wheel=build_wheel(tmp_path / "dist", "toy-lib", "2.0", files, ("kernels>=0.19.1,<0.20",)))
    add_target(factory, "https://example.com/toy/toy-lib", name="toy-lib", install=InstallMode.pip, policy=CommitPolicy.every)
    monkeypatch.setenv("PIP_INDEX_URL", f"{index.url}/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    worker = start_worker("gpu-1")

    (run_id,) = tasks.poll_releases()["runs"]  # queued and sent to the worker, as beat's poll would

    def alerted() -> bool:
        with factory() as session:
            return session.scalars(select(Alert)).first() is not None

    wait_for(alerted, timeout=240, what="the uninstallable alert", logs=worker.output)
    with factory() as session:
        run = session.get_one(Run, run_id)
        (alert,) = session.scalars(select(Alert)).all()
    assert (run.status, run.attempt, run.install_failures) == (RunStatus.uninstallable, 3, 3)
    assert alert.kind is AlertKind.uninstallable
    assert alert.cases[0]["requirement"] == "kernels<0.20,>=0.19.1"
    log = worker.output()
    assert log.count("run_install_failed") == 2  # two retries, each sent back with a countdown...
    assert "retry: Retry in 1.0s" in log
    assert "retry: Retry in 2.0s" in log
    assert "run_uninstallable" in log  # ...then the third failure ends the run
