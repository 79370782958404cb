"""`specwatch serve / worker / beat`: the options reach workers.cli, which builds Celery's own arguments.

Nothing here starts a worker or configures the process's Celery app (the e2e tests run the commands).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from service import db
from service.cli import app
from service.settings import Settings, get_settings
from workers import cli as workers_cli
from workers.celery_app import celery_config
from workers.embedded import EMBEDDED_BROKER_URL, EMBEDDED_QUEUES, embedded_config
from workers.settings import WorkerSettings, get_worker_settings

runner = CliRunner()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """workers.cli's commands replaced by recorders that exit with 0."""
    recorded: list[tuple[str, dict[str, Any]]] = []
    for name in ("serve", "worker", "beat"):

        def record(*, _name: str = name, **kwargs: Any) -> int:
            recorded.append((_name, kwargs))
            return 0

        monkeypatch.setattr(workers_cli, name, record)
    return recorded


def test_serve_defaults_to_localhost_8000(calls: list[tuple[str, dict[str, Any]]]) -> None:
    result = runner.invoke(app, ["serve"])

    assert result.exit_code == 0, result.output
    assert calls == [("serve", {"host": "127.0.0.1", "port": 8000, "database_url": None})]


def test_serve_options(calls: list[tuple[str, dict[str, Any]]]) -> None:
    result = runner.invoke(app, ["serve", "--host", "0.0.0.0", "--port", "0", "--database-url", "sqlite:///x.db"])

    assert result.exit_code == 0, result.output
    assert calls == [("serve", {"host": "0.0.0.0", "port": 0, "database_url": "sqlite:///x.db"})]


def test_worker_options_and_celery_passthrough(calls: list[tuple[str, dict[str, Any]]]) -> None:
    result = runner.invoke(app, ["worker", "-Q", "gpu", "-c", "2", "-n", "gpu-1@%h", "--without-gossip", "--pool", "solo"])

    assert result.exit_code == 0, result.output
    assert calls == [
        (
            "worker",
            {
                "queues": "gpu",
                "concurrency": 2,
                "loglevel": "INFO",
                "hostname": "gpu-1@%h",
                "extra": ["--without-gossip", "--pool", "solo"],
            },
        )
    ]


def test_worker_defaults_consume_both_queues_one_task_at_a_time(calls: list[tuple[str, dict[str, Any]]]) -> None:
    assert runner.invoke(app, ["worker"]).exit_code == 0
    assert calls == [("worker", {"queues": "gpu,default", "concurrency": 1, "loglevel": "INFO", "hostname": None, "extra": []})]


def test_worker_refuses_zero_concurrency(calls: list[tuple[str, dict[str, Any]]]) -> None:
    assert runner.invoke(app, ["worker", "-c", "0"]).exit_code == 2
    assert calls == []


def test_beat_options(calls: list[tuple[str, dict[str, Any]]]) -> None:
    result = runner.invoke(app, ["beat", "--schedule", "/var/lib/specwatch/beat", "--max-interval", "5"])

    assert result.exit_code == 0, result.output
    assert calls == [("beat", {"schedule": Path("/var/lib/specwatch/beat"), "loglevel": "INFO", "extra": ["--max-interval", "5"]})]


def test_the_exit_status_of_the_command_is_the_process_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers_cli, "worker", lambda **_: 2)
    assert runner.invoke(app, ["worker"]).exit_code == 2


def test_celery_arguments() -> None:
    assert workers_cli.worker_argv(queues=["gpu"], concurrency=1, loglevel="INFO", hostname="gpu-1@%h", extra=["--pool", "solo"]) == [
        "worker",
        "--queues",
        "gpu",
        "--concurrency",
        "1",
        "--loglevel",
        "INFO",
        "--hostname",
        "gpu-1@%h",
        "--pool",
        "solo",
    ]
    assert workers_cli.beat_argv(schedule=Path("/tmp/beat"), loglevel="DEBUG", extra=[]) == [
        "beat",
        "--loglevel",
        "DEBUG",
        "--schedule",
        "/tmp/beat",
    ]
    assert workers_cli.beat_argv(schedule=None, loglevel="INFO", extra=[]) == ["beat", "--loglevel", "INFO"]


def test_queues_are_checked() -> None:
    assert workers_cli.parse_queues(" gpu , default ", ["gpu", "default"]) == ["gpu", "default"]
    with pytest.raises(ValueError, match="unknown queue"):
        workers_cli.parse_queues("gpu,cpu", ["gpu", "default"])
    with pytest.raises(ValueError, match="unknown queue"):
        workers_cli.parse_queues(",", ["gpu", "default"])


def test_the_embedded_worker_changes_only_the_broker_and_results() -> None:
    config = embedded_config()
    production = celery_config(Settings(), WorkerSettings())

    assert config["broker_url"] == EMBEDDED_BROKER_URL == "memory://localhost/"
    assert config["result_backend"] is None
    assert config["task_ignore_result"] is True
    # Queues, routes, time limits and the beat schedule stay the production ones (but for the outbox's route,
    # workers.embedded_outbox.outbox_config, tested with the outbox thread).
    assert not {"task_queues", "task_routes", "task_annotations", "beat_schedule"} & set(config)
    assert set(EMBEDDED_QUEUES) == {queue.name for queue in production["task_queues"]}


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[Settings]]:
    """``workers.cli.serve`` up to the embedded service, which records the settings it was given; the variable serve
    sets and the process's cached settings are undone afterwards."""
    given: list[Settings] = []
    monkeypatch.setattr(workers_cli.embedded, "serve", lambda settings, **_: given.append(settings))
    monkeypatch.setenv("SPECWATCH_DATABASE_URL", f"sqlite:///{tmp_path / 'specwatch.db'}")
    monkeypatch.setenv("SPECWATCH_DASHBOARD_URL", "unset below")  # recorded, so that teardown restores the original
    monkeypatch.delenv("SPECWATCH_DASHBOARD_URL")
    monkeypatch.chdir(tmp_path)  # no .env of the checkout
    yield given
    os.environ.pop("SPECWATCH_DASHBOARD_URL", None)
    for cached in (get_settings, get_worker_settings, db.session_factory, db.get_engine):
        cached.cache_clear()


@pytest.mark.parametrize(
    ("host", "port", "url"),
    [("127.0.0.1", 8766, "http://127.0.0.1:8766"), ("0.0.0.0", 9000, "http://127.0.0.1:9000"), ("::1", 8000, "http://[::1]:8000")],
)
def test_serve_links_its_dashboard_at_the_address_it_serves(served: list[Settings], host: str, port: int, url: str) -> None:
    """Slack messages and commit statuses of a serve on another port linked the default 127.0.0.1:8000."""
    assert workers_cli.serve(host=host, port=port) == 0
    assert [s.dashboard_url for s in served] == [url]


def test_serve_keeps_a_configured_dashboard_url_and_the_default_for_any_port(
    served: list[Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert workers_cli.serve(host="127.0.0.1", port=0) == 0
    monkeypatch.setenv("SPECWATCH_DASHBOARD_URL", "https://specwatch.example")
    assert workers_cli.serve(host="127.0.0.1", port=8766) == 0
    assert [s.dashboard_url for s in served] == ["http://127.0.0.1:8000", "https://specwatch.example"]
