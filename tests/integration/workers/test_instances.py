"""A worker's folders belong to one instance (issue 42, item 1): two instances on one machine, each with a fresh
database whose run ids start at 1, never meet each other's ``run-1-attempt-1``."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.instance import KEY_LENGTH, instance_key
from service.models import InstanceIdentity, Run, RunStatus
from tests.support.toy_target import ADAPTER, CORRECT, ToyRepo
from tests.support.workers import add_runs, session_maker
from workers.execution import AttemptStatus, execute_run, instance_folders
from workers.settings import WorkerSettings

pytestmark = pytest.mark.usefixtures("worker_env")


def key_of(factory: sessionmaker[Session]) -> str:
    with session_scope(factory) as session:
        return instance_key(session)


def test_each_database_is_an_instance_of_its_own_and_keeps_its_key(
    factory: sessionmaker[Session], create_migrated_postgres_database: Callable[[], str]
) -> None:
    """Two copies of one migrated template hold the same random row, yet are two instances; a key never changes
    for one database; a database whose row is gone (created again, restored without it) is a new instance."""
    with session_maker(create_migrated_postgres_database()) as other:
        first, second = key_of(factory), key_of(other)
        assert len(first) == KEY_LENGTH
        assert first != second
        assert key_of(factory) == first

        with session_scope(other) as session:
            session.execute(delete(InstanceIdentity))
        redrawn = key_of(other)
        assert redrawn not in (first, second)
        assert key_of(other) == redrawn


def _machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, Path]:
    """One machine's home and temporary folder, where the default folders of every instance on it derive."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    return home, tmp


def test_two_instances_on_one_machine_run_their_run_1_at_once_and_both_pass_on_the_first_attempt(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    factory: sessionmaker[Session],
    create_migrated_postgres_database: Callable[[], str],
    toy_repo: ToyRepo,
) -> None:
    home, tmp = _machine(monkeypatch, tmp_path)
    # The default folders (no SPECWATCH_WORKER_MIRROR_DIR or _SCRATCH_DIR), as `specwatch serve` has them.
    settings = WorkerSettings(mirror_dir=None, scratch_dir=None, device="cpu", memory_limit_mb=8192, lease_s=30, heartbeat_s=1)
    sha = toy_repo.commit(CORRECT, "good")
    # Leftovers of other instances on this machine: the shared folder of old, and a third instance's own folder,
    # each with a run-1-attempt-1 whose mirror does not exist here.
    foreign = [tmp / "specwatch-runs" / "run-1-attempt-1" / "checkout", tmp / "specwatch-runs" / ("f" * KEY_LENGTH) / "run-1-attempt-1"]
    for leftover in foreign:
        leftover.mkdir(parents=True)
        (leftover / "marker").write_text("another instance's")

    with session_maker(create_migrated_postgres_database()) as other:
        factories = [factory, other]
        run_ids = [add_runs(made, toy_repo.url, [sha], adapter=ADAPTER)[0] for made in factories]
        assert run_ids == [1, 1]
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(lambda made: execute_run(1, factory=made, settings=settings), factories))
        folders = [instance_folders(made, settings) for made in factories]
        runs = []
        for made in factories:
            with made() as session:
                runs.append(session.get_one(Run, 1))

    assert [r.status for r in results] == [AttemptStatus.passed, AttemptStatus.passed], [r.reason for r in results]
    assert [(run.status, run.attempt, run.error) for run in runs] == [(RunStatus.passed, 1, None)] * 2
    assert folders[0].scratch != folders[1].scratch
    assert folders[0].mirrors != folders[1].mirrors
    for own in folders:
        assert own.scratch.parent == tmp / "specwatch-runs"
        assert own.mirrors.is_relative_to(home / ".cache" / "specwatch" / "instances")
        assert len(list(own.mirrors.glob("*.git"))) == 1  # each instance cloned its own mirror
        assert list(own.scratch.iterdir()) == []  # and removed its scratch
    for leftover in foreign:
        assert (leftover / "marker").read_text() == "another instance's"
