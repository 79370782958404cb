"""Issue 26's replayed history, all real: a bug fixed by a revert that comes back later opens a new alert.

Signed pushes to the app served by uvicorn, ``specwatch worker`` running the suite on a mirror of a real git
repository, PostgreSQL and Redis. The toy sampler on ``main``: correct (A), the swapped residual (B), a revert
of B (C), then one push of a harmless commit (D) and the bug again (E). With the head policy only E of the last
push is run, so D is left to the search. Each push waits until every run is finished and analysed, as a human
pace would.

Before the fix the second failure was bisected over the whole branch: first bad B, last good A, 0 runs,
merged quietly into the resolved alert; nothing was open and D was never tested.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.models import Alert, AlertKind, AlertState, Commit, Notification, Run, RunPurpose
from tests.e2e.conftest import WRITE, WorkerProcess, app_settings, served, wait_for
from tests.support.github import REPO_URL, ZERO_SHA, post_webhook, push_payload
from tests.support.toy_target import ADAPTER, CORRECT, SWAPPED_RESIDUAL, ToyRepo, git
from tests.support.workers import REDIS_URL, WEBHOOK_SECRET

# A worker start and seven suite runs: about a minute.
pytestmark = pytest.mark.slow

TARGET = {"name": "mylib2", "repo_url": REPO_URL, "branches": ["main"], "adapter": ADAPTER, "commit_policy": "head"}


def settled(factory: sessionmaker[Session], runs_at_least: int) -> bool:
    """At least ``runs_at_least`` runs, every one finished and analysed (nothing left to queue)."""
    with factory() as session:
        runs = session.scalars(select(Run)).all()
        return len(runs) >= runs_at_least and all(r.analysed_at is not None for r in runs)


def commit_ids(factory: sessionmaker[Session]) -> dict[str, int]:
    with factory() as session:
        return {row.sha: row.id for row in session.execute(select(Commit.sha, Commit.id))}


def test_a_bug_back_after_a_revert_is_bisected_from_the_fix_and_opens_a_new_alert(
    database_url: str,
    factory: sessionmaker[Session],
    toy_repo: ToyRepo,
    start_service_worker: Callable[..., WorkerProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = toy_repo.commit(CORRECT, "Add speculative sampling")
    bad = toy_repo.commit(SWAPPED_RESIDUAL, "Simplify the residual")
    git(toy_repo.path, "revert", "--no-edit", "HEAD")
    revert = git(toy_repo.path, "rev-parse", "HEAD")
    harmless = toy_repo.commit(CORRECT.replace('"""Speculative sampling', '"""Speculative sampling, reworded:', 1), "Reword")
    again = toy_repo.commit(SWAPPED_RESIDUAL, "Simplify the residual, again")
    monkeypatch.setenv("SPECWATCH_SLACK_WEBHOOK_URL", "http://127.0.0.1:9/never-called")  # the outbox rows are checked
    worker = start_service_worker("gpu-1")

    def push(before: str, after: str, runs_at_least: int) -> None:
        answer = post_webhook(client, WEBHOOK_SECRET, "push", push_payload(toy_repo.path, before, after))
        assert answer.status_code == 202, answer.text
        wait_for(lambda: settled(factory, runs_at_least) or worker.proc.poll() is not None, timeout=240, what="runs", logs=worker.output)
        assert worker.proc.poll() is None, worker.output()

    with served(create_app(app_settings(database_url, REDIS_URL))) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/targets", json=TARGET, headers=WRITE).status_code == 201
        push(ZERO_SHA, good, 1)
        push(good, bad, 3)  # B and its confirmation
        push(bad, revert, 4)
        with factory() as session:
            (first,) = session.scalars(select(Alert)).all()
            assert first.state is AlertState.resolved
        push(revert, again, 6)  # one push of D and E: E, its confirmation, then D by the search

    ids = commit_ids(factory)
    with factory() as session:
        first, second = session.scalars(select(Alert).order_by(Alert.id)).all()
        assert (first.first_bad_commit_id, first.resolved_by_commit_id) == (ids[bad], ids[revert])
        assert first.state is AlertState.resolved
        assert (second.kind, second.state, second.confirmed) == (AlertKind.violation, AlertState.open, True)
        assert (second.first_bad_commit_id, second.last_good_commit_id) == (ids[again], ids[harmless])
        assert second.bisection_runs == 1
        (midpoint,) = session.scalars(select(Run).where(Run.purpose == RunPurpose.bisection)).all()
        assert midpoint.commit_id == ids[harmless]
        outbox = session.execute(select(Notification.event, Notification.alert_id).where(Notification.alert_id.is_not(None)))
        assert sorted(outbox, key=lambda row: (row[1], row[0])) == [
            ("opened", first.id),
            ("resolved", first.id),
            ("opened", second.id),
        ]
