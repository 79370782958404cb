"""Shared set-up of poller tests: an upstream remote (a bare repository), targets, poll state, the gpu queue."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.models import Commit, CommitPolicy, InstallMode, PollState, Run, Target
from tests.support.toy_target import ADAPTER, ToyRepo, git
from tests.support.workers import REDIS_URL


@dataclass(frozen=True)
class Remote:
    """A bare repository standing for the upstream remote, and a working clone that pushes to it."""

    work: ToyRepo
    bare: Path

    @property
    def url(self) -> str:
        return str(self.bare)

    @classmethod
    def create(cls, tmp_path: Path, commits: int = 1) -> Remote:
        work = ToyRepo.create(tmp_path / "upstream-work")
        for i in range(commits):
            work.commit(f"# version {i}\n", f"commit {i}")
        bare = tmp_path / "upstream.git"
        git(tmp_path, "clone", "--quiet", "--bare", str(work.path), str(bare))
        return cls(work, bare)

    def commit(self, message: str) -> str:
        """A commit on the working clone's current branch, touching a file of its own (merges never conflict)."""
        changes = self.work.path / "changes"
        changes.mkdir(exist_ok=True)
        (changes / f"{hashlib.sha256(message.encode()).hexdigest()[:12]}.txt").write_text(message + "\n")
        git(self.work.path, "add", "--all")
        git(self.work.path, "commit", "--quiet", "-m", message)
        return git(self.work.path, "rev-parse", "HEAD")

    def push(self, branch: str = "main", *, force: bool = False) -> None:
        git(self.work.path, "push", "--quiet", *(["--force"] if force else []), str(self.bare), branch)

    def head(self, branch: str = "main") -> str:
        return git(self.bare, "rev-parse", f"refs/heads/{branch}")


def add_target(
    factory: sessionmaker[Session],
    repo_url: str,
    *,
    name: str = "upstream",
    branches: tuple[str, ...] = ("main",),
    policy: CommitPolicy = CommitPolicy.head,
    install: InstallMode = InstallMode.source,
    poll_s: int | None = 300,
) -> int:
    with session_scope(factory) as session:
        target = Target(
            name=name,
            repo_url=repo_url,
            adapter=ADAPTER,
            branches=list(branches),
            install_mode=install,
            poll_interval_s=poll_s,
            commit_policy=policy,
        )
        session.add(target)
        session.flush()
        return target.id


def time_passes(factory: sessionmaker[Session]) -> None:
    """Every target is due again: its last poll moved a day back."""
    with session_scope(factory) as session:
        for state in session.scalars(select(PollState)):
            if state.polled_at is not None:
                state.polled_at = state.polled_at.replace(year=state.polled_at.year - 1)


def recorded(factory: sessionmaker[Session], target_id: int, branch: str | None = "main") -> list[Commit]:
    with factory() as session:
        on_branch = Commit.branch.is_(None) if branch is None else Commit.branch == branch
        commits = list(session.scalars(select(Commit).where(Commit.target_id == target_id, on_branch).order_by(Commit.branch_order)))
        session.expunge_all()
        return commits


def runs(factory: sessionmaker[Session], target_id: int) -> dict[str, Run]:
    """The target's runs by commit sha."""
    with factory() as session:
        rows = session.execute(select(Commit.sha, Run).join(Run.commit).where(Commit.target_id == target_id).order_by(Run.id)).all()
        session.expunge_all()
        return {row[0]: row[1] for row in rows}


def state(factory: sessionmaker[Session], target_id: int, ref: str = "main") -> PollState:
    with factory() as session:
        found = session.scalars(select(PollState).where(PollState.target_id == target_id, PollState.ref == ref)).one()
        session.expunge(found)
        return found


def enqueued() -> list[int]:
    """The run ids waiting in Redis' ``gpu`` queue, oldest first (what a GPU worker would consume)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        messages = client.lrange("gpu", 0, -1)
    finally:
        client.close()
    ids = []
    for raw in reversed(messages):  # LPUSH: the newest is first
        message = json.loads(raw)
        assert message["headers"]["task"] == "workers.run_suite"
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        ids.append(args[0])
    return ids


def release_shas(factory: sessionmaker[Session], target_id: int) -> list[str]:
    """The target's releases (commits ``release:<version>``) in their recorded order."""
    return [c.sha for c in recorded(factory, target_id, branch=None)]
