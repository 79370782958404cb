"""``specwatch serve``, the embedded default, as a user runs it: one process, an empty SQLite file, no Redis.

The command runs in a subprocess from a scratch directory, with ``SPECWATCH_REDIS_URL`` pointing at a closed
port (nothing may need Redis), and is stopped with SIGTERM as a service manager would.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.auth import hash_token
from service.models import CaseResult, Commit, Notification, NotificationStatus, Run, RunPurpose, RunStatus
from service.schema import upgrade_to_head
from tests.e2e.conftest import wait_for
from tests.support.github import REPO_URL, git_redirect, push_history
from tests.support.http_fakes import fake_server
from tests.support.toy_target import ADAPTER, CORRECT, SWAPPED_RESIDUAL, ToyRepo
from tests.support.workers import add_runs, session_maker

# The service's start plus one or two suite runs: 10-20 s each test.
pytestmark = pytest.mark.slow

SPECWATCH = str(Path(sys.executable).parent / "specwatch")
SECRET = "serve-test-webhook-secret"
API_TOKEN = "serve-test-api-token"
FINISHED = {RunStatus.passed, RunStatus.failed, RunStatus.error, RunStatus.cancelled}
LISTENING = re.compile(r"Uvicorn running on (http://127\.0\.0\.1:\d+)")


@dataclass
class Served:
    """A running ``specwatch serve``: its process (own process group), its output, its URL."""

    proc: subprocess.Popen[bytes]
    log: Path
    url: str = ""

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def terminate(self) -> int:
        """SIGTERM, as systemd or docker stop send it; the exit status."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'specwatch.db'}"


@pytest.fixture
def sqlite_factory(sqlite_url: str) -> Iterator[sessionmaker[Session]]:
    with session_maker(sqlite_url) as made:
        yield made


@pytest.fixture
def start_serve(tmp_path: Path, toy_repo: ToyRepo, sqlite_url: str) -> Iterator[Callable[..., Served]]:
    """Start ``specwatch serve --port 0`` on ``sqlite_url`` (keyword arguments: more environment variables; ``database``:
    another database; ``default_folders``: the worker's mirror and scratch folders left to their defaults); every one
    started is stopped at the end."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SPECWATCH_")}
    env.update(
        SPECWATCH_WEBHOOK_SECRET=SECRET,
        SPECWATCH_API_TOKEN_HASHES=hash_token(API_TOKEN),
        SPECWATCH_RUN_PROFILE="smoke",
        SPECWATCH_REDIS_URL="redis://127.0.0.1:1/0",
        SPECWATCH_WORKER_MIRROR_DIR=str(tmp_path / "mirrors"),
        SPECWATCH_WORKER_SCRATCH_DIR=str(tmp_path / "scratch"),
        SPECWATCH_WORKER_DEVICE="cpu",
        SPECWATCH_WORKER_MEMORY_LIMIT_MB="8192",
        **git_redirect(toy_repo.path),
    )
    workdir = tmp_path / "laptop"
    workdir.mkdir()
    started: list[Served] = []

    def start(*, database: str | None = None, default_folders: bool = False, **more_env: str) -> Served:
        log = tmp_path / f"serve-{len(started)}.log"
        command = [SPECWATCH, "serve", "--host", "127.0.0.1", "--port", "0", "--database-url", database or sqlite_url]
        folders = ("SPECWATCH_WORKER_MIRROR_DIR", "SPECWATCH_WORKER_SCRATCH_DIR") if default_folders else ()
        served_env = {name: value for name, value in {**env, **more_env}.items() if name not in folders}
        with log.open("wb") as out:
            proc = subprocess.Popen(command, cwd=workdir, env=served_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        served = Served(proc, log)
        started.append(served)

        def listening() -> bool:
            found = LISTENING.search(served.output())
            served.url = found[1] if found else ""
            return bool(found) or proc.poll() is not None

        wait_for(listening, timeout=60, what="specwatch serve to listen", logs=served.output)
        assert served.url, f"specwatch serve exited with {proc.returncode}:\n{served.output()}"
        return served

    yield start
    for served in started:
        served.terminate()


def run_statuses(factory: sessionmaker[Session]) -> list[tuple[str, RunStatus]]:
    with factory() as session:
        query = select(Commit.sha, Run.status).join(Run.commit).where(Run.purpose == RunPurpose.primary).order_by(Run.id)
        return [(sha, status) for sha, status in session.execute(query)]


def finished(factory: sessionmaker[Session], count: int) -> bool:
    statuses = run_statuses(factory)
    return len(statuses) == count and all(status in FINISHED for _, status in statuses)


def test_serve_tests_pushed_commits_without_redis(
    start_serve: Callable[[], Served], sqlite_factory: sessionmaker[Session], toy_repo: ToyRepo
) -> None:
    good = toy_repo.commit(CORRECT, "Add speculative sampling")
    bad = toy_repo.commit(SWAPPED_RESIDUAL, "Simplify the residual")
    served = start_serve()

    with httpx.Client(base_url=served.url, timeout=30) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        target = {"name": "toy-sampler", "repo_url": REPO_URL, "branches": ["main"], "adapter": ADAPTER}
        assert client.post("/targets", json=target, headers={"Authorization": f"Bearer {API_TOKEN}"}).status_code == 201
        answers = push_history(client, SECRET, toy_repo.path, [good, bad])
        assert [(answer.status_code, answer.json()["outcome"]) for answer in answers] == [(202, "accepted")] * 2
        wait_for(
            lambda: finished(sqlite_factory, 2) or served.proc.poll() is not None, timeout=180, what="two finished runs", logs=served.output
        )

    assert served.proc.poll() is None, served.output()
    assert run_statuses(sqlite_factory) == [(good, RunStatus.passed), (bad, RunStatus.failed)]
    with sqlite_factory() as session:
        assert session.scalar(select(func.count()).select_from(CaseResult)) == 4
    assert served.terminate() == 0, served.output()
    assert "Connected to memory://" in served.output()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_serve_instances_on_one_machine_both_pass_their_run_1_on_the_first_attempt(
    start_serve: Callable[..., Served],
    tmp_path: Path,
    toy_repo: ToyRepo,
    backend: str,
    create_postgres_database: Callable[..., str],
) -> None:
    """Two ``specwatch serve`` with fresh databases (two SQLite files, or two empty PostgreSQL databases on one
    server, migrated by ``serve``), one HOME and one TMPDIR, their worker folders left to the defaults, each testing
    its run 1 at once (issue 42: the second met the first's ``run-1-attempt-1``, crashed three attempts and paged a
    broken commit)."""
    good = toy_repo.commit(CORRECT, "Add speculative sampling")
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    if backend == "sqlite":
        databases = [f"sqlite:///{tmp_path / name}" for name in ("first.db", "second.db")]
    else:
        databases = [create_postgres_database(), create_postgres_database()]
    instances = [start_serve(database=url, default_folders=True, HOME=str(home), TMPDIR=str(tmp)) for url in databases]
    target = {"name": "toy-sampler", "repo_url": REPO_URL, "branches": ["main"], "adapter": ADAPTER}
    for served in instances:
        with httpx.Client(base_url=served.url, timeout=30) as client:
            assert client.post("/targets", json=target, headers={"Authorization": f"Bearer {API_TOKEN}"}).status_code == 201
    for served in instances:  # the two pushes back to back: the runs overlap
        with httpx.Client(base_url=served.url, timeout=30) as client:
            assert [answer.status_code for answer in push_history(client, SECRET, toy_repo.path, [good])] == [202]

    with session_maker(databases[0]) as first, session_maker(databases[1]) as second:
        factories = [first, second]
        wait_for(lambda: all(finished(made, 1) for made in factories), timeout=240, what="both runs 1", logs=instances[1].output)
        runs = []
        for made in factories:
            with made() as session:
                run = session.scalars(select(Run)).one()
                runs.append((run.id, run.status, run.attempt, run.error))

    assert runs == [(1, RunStatus.passed, 1, None)] * 2, [served.output()[-3000:] for served in instances]
    assert len(list((tmp / "specwatch-runs").iterdir())) == 2  # a scratch folder per instance
    assert len(list((home / ".cache" / "specwatch" / "instances").iterdir())) == 2  # and a mirror folder


def test_serve_resumes_runs_left_queued_by_a_previous_process(
    start_serve: Callable[[], Served], sqlite_factory: sessionmaker[Session], sqlite_url: str, toy_repo: ToyRepo
) -> None:
    # What a process that died after committing a run, before its in-memory message was consumed, leaves behind.
    upgrade_to_head(sqlite_url)
    sha = toy_repo.commit(CORRECT, "Add speculative sampling")
    (run_id,) = add_runs(sqlite_factory, toy_repo.url, [sha], adapter=ADAPTER)

    served = start_serve()
    wait_for(
        lambda: finished(sqlite_factory, 1) or served.proc.poll() is not None,
        timeout=180,
        what="the resumed run to finish",
        logs=served.output,
    )

    assert served.proc.poll() is None, served.output()
    assert run_statuses(sqlite_factory) == [(sha, RunStatus.passed)]
    assert f"resume_queued_runs runs=[{run_id}]" in served.output()
    assert served.terminate() == 0, served.output()


def test_serve_sends_each_status_while_the_runs_it_is_about_are_running(
    start_serve: Callable[..., Served], sqlite_factory: sessionmaker[Session], toy_repo: ToyRepo
) -> None:
    """Issue 26, item 6: under ``serve`` a commit's ``pending`` status went out after its run had passed, and the
    failing run's "confirming" 0.1 s before "failure", both queued behind suite runs in the one-task worker. Now
    the outbox thread sends each before the run it announces has finished."""
    good = toy_repo.commit(CORRECT, "Add speculative sampling")
    bad = toy_repo.commit(SWAPPED_RESIDUAL, "Simplify the residual")
    with fake_server([(201, {})]) as github:
        served = start_serve(SPECWATCH_GITHUB_TOKEN="ghp_serve-test", SPECWATCH_GITHUB_API_URL=github.url)
        with httpx.Client(base_url=served.url, timeout=30) as client:
            target = {"name": "toy-sampler", "repo_url": REPO_URL, "branches": ["main"], "adapter": ADAPTER}
            assert client.post("/targets", json=target, headers={"Authorization": f"Bearer {API_TOKEN}"}).status_code == 201
            push_history(client, SECRET, toy_repo.path, [good, bad])

            def confirmed() -> bool:
                with sqlite_factory() as session:
                    events = session.scalars(select(Notification.event).where(Notification.status == NotificationStatus.sent))
                    return "confirmed" in set(events) or served.proc.poll() is not None

            wait_for(confirmed, timeout=240, what="the failing commit's confirmed status", logs=served.output)
        assert served.proc.poll() is None, served.output()

    with sqlite_factory() as session:
        runs = {run.id: run for run in session.scalars(select(Run))}
        rows = list(session.scalars(select(Notification).order_by(Notification.id)))
    statuses = [(row.run_id, row.event, row.sent_at) for row in rows if row.status is NotificationStatus.sent]
    primary = [run for run in runs.values() if run.purpose is RunPurpose.primary]
    assert len(primary) == 2
    for run in primary:
        [pending_sent] = [sent for run_id, event, sent in statuses if run_id == run.id and event == "pending"]
        assert pending_sent is not None
        assert run.finished_at is not None
        assert pending_sent < run.finished_at, (run.id, pending_sent, run.finished_at)
    [confirmation] = [run for run in runs.values() if run.purpose is RunPurpose.confirmation]
    [confirming_sent] = [sent for _, event, sent in statuses if event == "confirming"]
    assert confirming_sent is not None
    assert confirmation.finished_at is not None
    assert confirming_sent < confirmation.finished_at, (confirming_sent, confirmation.finished_at)
    assert [r.body["state"] for r in github.requests if r.body["description"].endswith("confirming with fresh seeds before alerting")]
