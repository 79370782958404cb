"""History in git order (issue 26): an interleaved poll and push, real git, real PostgreSQL and Redis.

The upstream remote's ``main`` has a base commit (polled first), then three commits X, Y, H are pushed. The
poller runs first and records only what moved... as the issue saw it: the branch's head H alone (a first poll
of the branch records its head only). Then the push webhook for the same commits arrives, listing X and Y
(H's ancestors) and H. Arrival order would number H before X and Y; git order puts X, Y before H, so
``specwatch history``, the API's commits and the overview's head all agree with git.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from service.app import create_app
from service.cli import app as cli
from service.models import CommitPolicy
from service.queries.targets import targets_overview
from service.settings import Settings
from tests.support.github import post_webhook, push_payload
from tests.support.pollers import Remote, add_target, recorded
from tests.support.toy_target import git
from tests.support.workers import REDIS_URL, WEBHOOK_SECRET

# The module, not its tasks (see test_tasks.py).
from workers import tasks

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("worker_env")]


class Recording:
    def __init__(self) -> None:
        self.sent: list[int] = []

    def send_run(self, run_id: int) -> None:
        self.sent.append(run_id)


def local_push(remote: Remote, before: str, after: str) -> dict[str, Any]:
    """GitHub's push payload for ``before..after`` of the remote, its repository being the bare remote's path."""
    payload = push_payload(remote.work.path, before, after)
    payload["repository"] |= dict.fromkeys(("html_url", "url", "clone_url", "git_url", "ssh_url"), remote.url)
    payload["repository"]["full_name"] = None
    return payload


def test_a_push_of_ancestors_after_a_poll_of_the_head_is_recorded_in_git_order(
    factory: sessionmaker[Session], database_url: str, tmp_path: Path
) -> None:
    remote = Remote.create(tmp_path)
    base = remote.head()
    x, y, h = (remote.commit(f"change {name}") for name in "xyh")
    remote.push()
    target_id = add_target(factory, remote.url, name="upstream", policy=CommitPolicy.every)

    tasks.poll_branches()  # the first poll of main: its head H, with its parents from git
    assert [c.sha for c in recorded(factory, target_id)] == [h]
    settings = Settings(env="test", database_url=database_url, redis_url=REDIS_URL, webhook_secret=WEBHOOK_SECRET)
    with TestClient(create_app(settings, session_factory=factory, producer=Recording())) as client:
        answer = post_webhook(client, WEBHOOK_SECRET, "push", local_push(remote, base, h))
        assert answer.status_code == 202, answer.text
        assert answer.json()["commits"] == 2  # X and Y are new

        commits = [c.sha for c in recorded(factory, target_id)]
        assert commits == [x, y, h]
        assert [c.branch_order for c in recorded(factory, target_id)] == [1, 2, 3]
        page = client.get("/targets/upstream/commits").json()
        assert [c["sha"] for c in page["commits"]] == [h, y, x]  # newest first
    with factory() as session:  # the overview (dashboard and metrics) names each branch's head from this
        (overview,) = targets_overview(session)
    assert (overview.branches[0].sha, overview.branches[0].branch_order) == (h, 3)

    history = CliRunner().invoke(cli, ["history", "upstream", "--json"], obj=factory)
    assert history.exit_code == 0, history.output
    assert [c["sha"] for c in json.loads(history.stdout)["commits"]] == [h, y, x]
    assert git(remote.bare, "rev-list", "--reverse", f"{base}..{h}").split() == [x, y, h]


def test_a_late_ancestor_lands_in_its_place_after_later_commits(factory: sessionmaker[Session], database_url: str, tmp_path: Path) -> None:
    """A push of Y..H arrives before the one of X..Y (webhooks are not ordered): X lands before Y, not at the end."""
    remote = Remote.create(tmp_path)
    base = remote.head()
    x, y, h = (remote.commit(f"change {name}") for name in "xyh")
    remote.push()
    target_id = add_target(factory, remote.url, name="upstream", policy=CommitPolicy.every, poll_s=None)
    settings = Settings(env="test", database_url=database_url, redis_url=REDIS_URL, webhook_secret=WEBHOOK_SECRET)
    with TestClient(create_app(settings, session_factory=factory, producer=Recording())) as client:
        for before, after in [(y, h), (base, y)]:
            answer = post_webhook(client, WEBHOOK_SECRET, "push", local_push(remote, before, after))
            assert answer.status_code == 202, answer.text

    assert [c.sha for c in recorded(factory, target_id)] == [x, y, h]
