"""A suite worker that must isolate the suite and cannot refuses to start (workers/celery_app.py), through
Celery's own ``celeryd_init`` dispatch: one line and exit status 1, not a stream of runs ending in error."""

from __future__ import annotations

from typing import Any

import pytest
from celery import signals

import workers.celery_app
import workers.execution
from workers.settings import WorkerSettings

pytestmark = pytest.mark.unit

PROBLEM = "SPECWATCH_WORKER_SANDBOX=bwrap but bwrap failed (exit 1): bwrap: Can't mount proc on /newroot/proc: Operation not permitted"


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sandbox probes made (by mode); each one fails as under compose without the security options."""
    made: list[str] = []

    def failing_probe(settings: WorkerSettings) -> Any:
        made.append(settings.sandbox)
        raise RuntimeError(PROBLEM)

    monkeypatch.setattr(workers.execution, "sandbox_of", failing_probe)
    return made


def start(monkeypatch: pytest.MonkeyPatch, sandbox: str, queues: list[str] | None) -> None:
    monkeypatch.setattr(workers.celery_app, "get_worker_settings", lambda: WorkerSettings(sandbox=sandbox))
    signals.celeryd_init.send(sender="gpu@host", instance=None, conf=None, options={"queues": queues})


@pytest.mark.parametrize("queues", [["gpu"], ["default", "gpu"], None])
@pytest.mark.parametrize("sandbox", ["bwrap", "uid"])
def test_a_suite_worker_that_cannot_isolate_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, probes: list[str], sandbox: str, queues: list[str] | None
) -> None:
    with pytest.raises(SystemExit) as exited:
        start(monkeypatch, sandbox, queues)
    assert str(exited.value) == f"specwatch worker not started: it cannot isolate the suite: {PROBLEM} (docs/deployment.md)"
    assert "\n" not in str(exited.value)
    assert probes == [sandbox]


@pytest.mark.parametrize(("sandbox", "queues"), [("bwrap", ["default"]), ("auto", ["gpu"]), ("off", None)])
def test_other_workers_start_without_a_probe(
    monkeypatch: pytest.MonkeyPatch, probes: list[str], sandbox: str, queues: list[str] | None
) -> None:
    """Housekeeping workers run no suite; ``auto`` runs with what works (and warns on each run); ``off`` is asked for."""
    start(monkeypatch, sandbox, queues)
    assert probes == []
