"""Shared set-up of worker tests (a pytest plugin, see tests/conftest.py): the SPECWATCH_* environment of a
worker on a migrated PostgreSQL database of the test's own, a toy target repository, toy runs.

The integration tests call tasks in this process with a long lease; tests/e2e overrides :func:`worker_timing`
for real worker processes (short leases, a sweep every second).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service import db
from service.db import make_engine, session_scope
from service.models import Commit, Run, Target
from service.settings import get_settings
from specwatch.protocol import Acceptance
from specwatch.protocol import CaseResult as SuiteCaseResult
from specwatch.protocol import Verdict as SuiteVerdict
from tests.support.redis_databases import SERVER, redis_url
from tests.support.toy_target import ToyRepo
from workers.celery_app import app, celery_config
from workers.settings import get_worker_settings

# The Redis server is SPECWATCH_TEST_REDIS_URL (default: the local one). Each test process claims databases of its
# own on it (tests/support/redis_databases.py): parallel tests, and two checkouts testing at once, never consume
# each other's messages. REDIS_URL (this module's attribute, claimed on first use) is the worker tests' database.
REDIS_SERVER = SERVER


def __getattr__(name: str) -> str:
    if name == "REDIS_URL":
        return redis_url("workers")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# A secret that must never reach the code under test.
WEBHOOK_SECRET = "super-secret-webhook-key"


def flush_redis() -> None:
    client = redis.Redis.from_url(redis_url("workers"))
    try:
        client.flushdb()
    finally:
        client.close()


def queued_headers(queue: str) -> list[dict[str, Any]]:
    """The headers of every message waiting in ``queue`` on the test's Redis, oldest first (kombu LPUSHes,
    consumers BRPOP)."""
    client = redis.Redis.from_url(redis_url("workers"))
    try:
        raw = client.lrange(queue, 0, -1)
    finally:
        client.close()
    return [json.loads(item)["headers"] for item in reversed(raw)]


def worker_environment(database_url: str, tmp_path: Path, **worker: str) -> dict[str, str]:
    """SPECWATCH_* variables of a test worker: its database, its Redis, its directories, CPU, short leases."""
    env = {
        "SPECWATCH_ENV": "test",
        "SPECWATCH_DATABASE_URL": database_url,
        "SPECWATCH_REDIS_URL": redis_url("workers"),
        "SPECWATCH_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "SPECWATCH_WORKER_MIRROR_DIR": str(tmp_path / "mirrors"),
        "SPECWATCH_WORKER_SCRATCH_DIR": str(tmp_path / "scratch"),
        "SPECWATCH_WORKER_DEVICE": "cpu",
        "SPECWATCH_WORKER_MEMORY_LIMIT_MB": "8192",
    }
    env.update({f"SPECWATCH_WORKER_{name.upper()}": value for name, value in worker.items()})
    return env


def clear_caches() -> None:
    if db.get_engine.cache_info().currsize:
        db.get_engine().dispose()
    for cached in (get_settings, get_worker_settings, db.get_engine, db.session_factory):
        cached.cache_clear()


def reconfigure_celery() -> None:
    """Point the worker's Celery app at the current settings when an earlier test already configured it.

    The app reads its configuration once, on first use (as a worker process does at start); a test that
    touched ``app.tasks`` before this test's environment was set would otherwise leave it publishing to
    the default broker, and the messages this test waits for would go elsewhere.
    """
    if app.configured:
        app.conf.update(celery_config(get_settings(), get_worker_settings()))
        app.close()  # drops the connection pools built for the previous broker


@contextmanager
def configured(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Iterator[None]:
    """This process configured as a worker by ``env`` (the tasks read settings, engine and factory lazily)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    clear_caches()
    reconfigure_celery()
    try:
        yield
    finally:
        clear_caches()


@contextmanager
def session_maker(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(database_url)
    try:
        yield sessionmaker(bind=engine, expire_on_commit=False)
    finally:
        engine.dispose()


def add_runs(
    factory: sessionmaker[Session],
    repo_url: str,
    shas: Sequence[str],
    *,
    adapter: str,
    profile: str = "smoke",
    max_attempts: int = 3,
) -> list[int]:
    """A target for ``repo_url`` with one queued run per commit (as the control plane records them)."""
    with session_scope(factory) as session:
        target = session.scalars(select(Target).where(Target.repo_url == repo_url)).one_or_none()
        if target is None:
            target = Target(
                name=f"toy-{len(repo_url)}-{abs(hash(repo_url)) % 10**6}", repo_url=repo_url, adapter=adapter, branches=["main"]
            )
        runs = []
        for order, sha in enumerate(shas):
            commit = Commit(target=target, sha=sha, branch="main", branch_order=order)
            run = Run(commit=commit, profile=profile, max_attempts=max_attempts)
            session.add(run)
            runs.append(run)
        session.flush()
        return [run.id for run in runs]


@pytest.fixture
def factory(database_url: str) -> Iterator[sessionmaker[Session]]:
    """Sessions on the test's own migrated database (its commits are real)."""
    with session_maker(database_url) as made:
        yield made


@pytest.fixture
def worker_timing() -> dict[str, str]:
    """The worker's lease settings (SPECWATCH_WORKER_*): tasks called in this process hold a run for 30 s."""
    return {"lease_s": "30", "heartbeat_s": "1"}


@pytest.fixture
def worker_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, database_url: str, worker_timing: dict[str, str]
) -> Iterator[dict[str, str]]:
    """The workers' SPECWATCH_* environment on ``database_url`` and a flushed Redis database; this process
    is configured by it too (the tasks read settings, engine and factory lazily)."""
    env = worker_environment(database_url, tmp_path, **worker_timing)
    flush_redis()
    with configured(monkeypatch, env):
        yield env
    flush_redis()


@pytest.fixture
def toy_repo(tmp_path: Path) -> ToyRepo:
    return ToyRepo.create(tmp_path / "toy")


def suite_case(case_id: str, verdict: str) -> SuiteCaseResult:
    """A suite case result with plain figures (what a worker reads from the suite's result file)."""
    v = SuiteVerdict(verdict)
    return SuiteCaseResult(
        case_id=case_id,
        family=case_id.split("/", maxsplit=1)[0],
        description="",
        verdict=v,
        reason="",
        lossless=v,
        conformance=SuiteVerdict.PASS,
        n_trials=1000,
        trial_cap=1000,
        powered=True,
        e_value=1.0,
        log_e_value=0.0,
        p_value=None,
        threshold=100.0,
        tv_estimate=None,
        tv_ci=None,
        acceptance=Acceptance(None, None),
        counts_digest="",
        fingerprint="",
        duration_s=0.1,
        seed=1,
        attempt=0,
        device="cpu",
    )
