"""Issue 26's interleaved poll and push, all real: the branch poller (``git ls-remote`` and the mirror), a signed
push to the app served by uvicorn, ``specwatch worker`` running the suite on a mirror of a real git repository,
PostgreSQL and Redis.

The toy sampler on ``main``: correct (A), the swapped residual (X), a harmless reword on top of it (Y) and another
(H), each run (policy every). The poller sees the branch for the first time and records its head H alone; the push
webhook of the branch arrives after it, listing A, X and Y. The worker starts once both are in. A passes; X, Y and
H fail, and each failure is confirmed and searched over the commits before it in git order: one alert, first bad
X, last good A, whichever failure is analysed first.

Before the history was kept in git order, A, X and Y were numbered after H (arrival order): H's search saw no
commit before it and named H a first bad commit of its own, beside X's.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.models import Alert, AlertKind, Commit, Run, RunPurpose
from tests.e2e.conftest import WRITE, WorkerProcess, app_settings, served, wait_for
from tests.e2e.test_regression_lifecycle import commit_ids, settled
from tests.support.github import REPO_URL, ZERO_SHA, git_redirect, post_webhook, push_payload
from tests.support.toy_target import ADAPTER, CORRECT, SWAPPED_RESIDUAL, ToyRepo
from tests.support.workers import REDIS_URL, WEBHOOK_SECRET, clear_caches

# The module, not its tasks (see tests/integration/workers/test_tasks.py).
from workers import tasks

# A worker start and five to seven suite runs: about two minutes.
pytestmark = pytest.mark.slow

TARGET = {"name": "polled", "repo_url": REPO_URL, "branches": ["main"], "adapter": ADAPTER, "commit_policy": "every", "poll": "5m"}


def test_a_push_of_ancestors_after_a_poll_of_the_head_is_bisected_in_git_order(
    database_url: str,
    factory: sessionmaker[Session],
    toy_repo: ToyRepo,
    start_service_worker: Callable[..., WorkerProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in git_redirect(toy_repo.path).items():  # this process polls REPO_URL too
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SPECWATCH_RUN_PROFILE", "smoke")  # the poll's runs, as the served app's
    clear_caches()
    good = toy_repo.commit(CORRECT, "Add speculative sampling")
    bad = toy_repo.commit(SWAPPED_RESIDUAL, "Simplify the residual")
    reworded = SWAPPED_RESIDUAL.replace('"""Speculative sampling', '"""Speculative sampling, reworded:', 1)
    middle = toy_repo.commit(reworded, "Reword")
    head = toy_repo.commit(reworded + "\n# reformatted\n", "Reformat")

    with served(create_app(app_settings(database_url, REDIS_URL))) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/targets", json=TARGET, headers=WRITE).status_code == 201
        polled = tasks.poll_branches()  # the first poll of main: its head H alone
        assert len(polled["runs"]) == 1, polled
        answer = post_webhook(client, WEBHOOK_SECRET, "push", push_payload(toy_repo.path, ZERO_SHA, head))
        assert answer.status_code == 202, answer.text
        assert answer.json()["commits"] == 3  # A, X and Y are new, each gets a run (policy every); H has its own
        assert client.get("/targets/polled/commits").json()["commits"][0]["sha"] == head  # the head is the newest

        worker = start_service_worker("gpu-1")  # started once the poll and the push are both in
        wait_for(lambda: settled(factory, 4) or worker.proc.poll() is not None, timeout=600, what="runs", logs=worker.output)
        assert worker.proc.poll() is None, worker.output()

    ids = commit_ids(factory)
    with factory() as session:
        order = list(session.scalars(select(Commit.sha).order_by(Commit.branch_order)))
        assert order == [good, bad, middle, head]
        (alert,) = session.scalars(select(Alert)).all()
        assert (alert.kind, alert.confirmed) == (AlertKind.violation, True)
        assert (alert.first_bad_commit_id, alert.last_good_commit_id) == (ids[bad], ids[good])
        statuses = session.execute(select(Run.commit_id, Run.status).where(Run.purpose == RunPurpose.primary))
        primary = {row[0]: row[1] for row in statuses}
        assert primary == {ids[good]: "passed", ids[bad]: "failed", ids[middle]: "failed", ids[head]: "failed"}
