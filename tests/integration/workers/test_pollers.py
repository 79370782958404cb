"""The pollers, called as tasks (no eager mode): real git remotes (bare repositories, pushed to between polls),
real PostgreSQL, real Redis (the enqueued messages are read back), a local package index over HTTP."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.ingest import RunOptions
from service.models import Commit, CommitPolicy, InstallMode, PollKind, PollState, Run, RunStatus
from service.repositories import RepoPolicy
from tests.support.package_index import PackageIndex, serve
from tests.support.pollers import Remote, add_target, enqueued, recorded, release_shas, runs, state, time_passes
from tests.support.postgres import migrate
from tests.support.toy_target import git
from tests.support.workers import session_maker

# The module, not its tasks (see test_tasks.py): collection must not configure the Celery app early.
from workers import pollers, tasks
from workers.checkout import MirrorCache
from workers.settings import get_worker_settings

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("worker_env")]


# --- branches ------------------------------------------------------------------------------------------


def test_the_first_poll_records_the_head_only_and_queues_it(factory: sessionmaker[Session], tmp_path: Path) -> None:
    remote = Remote.create(tmp_path, commits=3)
    target_id = add_target(factory, remote.url, policy=CommitPolicy.every)
    head = remote.head()

    report = tasks.poll_branches()

    assert report["polled"] == ["upstream"]
    assert report["errors"] == {}
    (commit,) = recorded(factory, target_id)
    assert (commit.sha, commit.branch_order) == (head, 1)
    assert commit.parents == [git(remote.bare, "rev-parse", f"{head}^")]
    assert commit.author == "Toy <toy@example.com>"
    assert commit.message == "commit 2"
    assert commit.committed_at is not None
    assert commit.committed_at.tzinfo is not None
    (run,) = runs(factory, target_id).values()
    assert run.status == RunStatus.queued
    assert run.lease_expires_at is not None  # the sweeper re-enqueues it if the message is lost
    assert report["runs"] == [run.id]
    assert enqueued() == [run.id]
    polled = state(factory, target_id)
    assert polled.kind == PollKind.branch
    assert polled.head == head
    assert polled.error is None
    assert polled.polled_at is not None
    assert polled.succeeded_at is not None
    assert polled.note is not None
    assert polled.note.startswith("first poll of main")


@pytest.mark.parametrize("policy", [CommitPolicy.every, CommitPolicy.head])
def test_new_commits_are_recorded_in_branch_order_and_queued_per_policy(
    factory: sessionmaker[Session], tmp_path: Path, policy: CommitPolicy
) -> None:
    remote = Remote.create(tmp_path)
    target_id = add_target(factory, remote.url, policy=policy)
    tasks.poll_branches()
    first = enqueued()
    pushed = [remote.commit(f"change {i}") for i in range(3)]
    remote.push()
    time_passes(factory)

    report = tasks.poll_branches()

    commits = recorded(factory, target_id)
    assert [c.sha for c in commits[1:]] == pushed
    assert [c.branch_order for c in commits] == [1, 2, 3, 4]
    assert [c.parents for c in commits[1:]] == [[commits[0].sha], [pushed[0]], [pushed[1]]]
    assert [c.message for c in commits[1:]] == ["change 0", "change 1", "change 2"]
    by_sha = runs(factory, target_id)
    tested = pushed if policy is CommitPolicy.every else pushed[-1:]
    assert list(by_sha) == [commits[0].sha, *tested]
    new_runs = [by_sha[sha].id for sha in tested]
    assert report["runs"] == new_runs
    assert enqueued() == first + new_runs
    assert state(factory, target_id).head == pushed[-1]


def test_a_merge_lists_the_first_parent_chain_not_the_merged_branch(factory: sessionmaker[Session], tmp_path: Path) -> None:
    remote = Remote.create(tmp_path)
    target_id = add_target(factory, remote.url, policy=CommitPolicy.every)
    tasks.poll_branches()
    git(remote.work.path, "checkout", "--quiet", "-b", "feature")
    side = [remote.commit(f"side {i}") for i in range(2)]
    git(remote.work.path, "checkout", "--quiet", "main")
    before = remote.commit("on main")
    git(remote.work.path, "merge", "--quiet", "--no-ff", "-m", "Merge feature", "feature")
    merge = git(remote.work.path, "rev-parse", "HEAD")
    remote.push()
    time_passes(factory)

    tasks.poll_branches()

    commits = recorded(factory, target_id)
    assert [c.sha for c in commits[1:]] == [before, merge]
    assert commits[-1].parents == [before, side[-1]]
    assert not set(side) & {c.sha for c in commits}


def test_no_new_commits_queue_nothing(factory: sessionmaker[Session], tmp_path: Path) -> None:
    remote = Remote.create(tmp_path)
    target_id = add_target(factory, remote.url)
    tasks.poll_branches()
    queued = enqueued()
    first = state(factory, target_id)

    assert tasks.poll_branches() == {"polled": [], "runs": [], "errors": {}}  # not due yet
    time_passes(factory)
    report = tasks.poll_branches()

    assert report == {"polled": ["upstream"], "runs": [], "errors": {}}
    assert len(recorded(factory, target_id)) == 1
    assert len(runs(factory, target_id)) == 1
    assert enqueued() == queued
    again = state(factory, target_id)
    assert again.head == first.head
    assert again.succeeded_at is not None
    assert first.succeeded_at is not None
    assert again.succeeded_at > first.succeeded_at


def test_a_forced_push_records_the_new_head_only(factory: sessionmaker[Session], tmp_path: Path) -> None:
    remote = Remote.create(tmp_path, commits=2)
    target_id = add_target(factory, remote.url, policy=CommitPolicy.every)
    tasks.poll_branches()
    old_head = remote.head()
    git(remote.work.path, "reset", "--quiet", "--hard", "HEAD~1")
    rewritten = [remote.commit("rewritten 1"), remote.commit("rewritten 2")]
    remote.push(force=True)
    time_passes(factory)

    report = tasks.poll_branches()

    commits = recorded(factory, target_id)
    assert [c.sha for c in commits] == [old_head, rewritten[-1]]
    assert commits[-1].parents == [rewritten[0]]
    assert list(runs(factory, target_id)) == [old_head, rewritten[-1]]
    assert report["runs"] == [runs(factory, target_id)[rewritten[-1]].id]
    polled = state(factory, target_id)
    assert polled.head == rewritten[-1]
    assert polled.note is not None
    assert "forced push" in polled.note


def test_an_unreachable_remote_keeps_the_state_and_raises_nothing(factory: sessionmaker[Session], tmp_path: Path) -> None:
    remote = Remote.create(tmp_path)
    target_id = add_target(factory, remote.url)
    tasks.poll_branches()
    head = remote.head()
    hidden = tmp_path / "away.git"
    remote.bare.rename(hidden)
    time_passes(factory)

    report = tasks.poll_branches()

    assert report["polled"] == ["upstream"]
    assert report["runs"] == []
    assert list(report["errors"]) == ["upstream/main"]
    failed = state(factory, target_id)
    assert failed.head == head
    assert failed.error is not None
    assert failed.error.startswith("remote unreachable")
    assert len(recorded(factory, target_id)) == 1

    hidden.rename(remote.bare)  # back online, with news
    new = remote.commit("while it was away")
    remote.push()
    time_passes(factory)
    report = tasks.poll_branches()

    assert report["errors"] == {}
    assert [c.sha for c in recorded(factory, target_id)] == [head, new]
    assert state(factory, target_id).error is None


def test_a_branch_missing_on_the_remote_is_an_error_of_that_branch_only(factory: sessionmaker[Session], tmp_path: Path) -> None:
    remote = Remote.create(tmp_path)
    target_id = add_target(factory, remote.url, branches=("main", "release"))

    report = tasks.poll_branches()

    assert list(report["errors"]) == ["upstream/release"]
    assert state(factory, target_id, "main").head == remote.head()
    missing = state(factory, target_id, "release")
    assert missing.head is None
    assert missing.error is not None
    assert "does not exist" in missing.error


def test_polling_continues_from_the_last_commit_a_webhook_recorded(factory: sessionmaker[Session], tmp_path: Path) -> None:
    remote = Remote.create(tmp_path)
    known = remote.head()
    target_id = add_target(factory, remote.url, policy=CommitPolicy.every)
    with session_scope(factory) as session:
        session.add(Commit(target_id=target_id, sha=known, branch="main", branch_order=1))
    new = remote.commit("after the webhook")
    remote.push()

    tasks.poll_branches()

    assert [c.sha for c in recorded(factory, target_id)] == [known, new]
    assert list(runs(factory, target_id)) == [new]


def test_targets_without_a_poll_interval_or_installed_from_pip_are_not_branch_polled(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    remote = Remote.create(tmp_path)
    add_target(factory, remote.url, name="webhook-only", poll_s=None)
    add_target(factory, remote.url, name="releases", install=InstallMode.pip)

    assert tasks.poll_branches() == {"polled": [], "runs": [], "errors": {}}


def test_runs_are_enqueued_only_once_the_record_transaction_commits(factory: sessionmaker[Session], tmp_path: Path) -> None:
    remote = Remote.create(tmp_path)
    target_id = add_target(factory, remote.url, policy=CommitPolicy.every)
    mirrors = MirrorCache(tmp_path / "mirrors", policy=RepoPolicy(allow_local=True))
    options = RunOptions(profile="smoke", queued_lease=timedelta(minutes=5))
    sent: list[list[int]] = []

    def database_gone_when_runs_commit(session: Session) -> None:
        if session.scalar(select(func.count()).select_from(Run)):  # the record step's transaction, not the claim's
            raise OperationalError("COMMIT", {}, ConnectionResetError("server closed the connection"))

    event.listen(factory, "before_commit", database_gone_when_runs_commit)
    try:
        with pytest.raises(OperationalError):
            pollers.poll_branches(factory, mirrors=mirrors, options=options, enqueue=sent.append)
    finally:
        event.remove(factory, "before_commit", database_gone_when_runs_commit)
    assert sent == []
    assert runs(factory, target_id) == {}

    time_passes(factory)
    pollers.poll_branches(factory, mirrors=mirrors, options=options, enqueue=sent.append)

    assert sent == [[run.id for run in runs(factory, target_id).values()]]
    assert len(sent[0]) == 1


# --- releases ------------------------------------------------------------------------------------------


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[PackageIndex]:
    with serve(PackageIndex()) as served:
        monkeypatch.setenv("SPECWATCH_WORKER_PYPI_URL", served.url)
        get_worker_settings.cache_clear()
        yield served
    get_worker_settings.cache_clear()


@pytest.mark.parametrize("policy", [CommitPolicy.every, CommitPolicy.head])
def test_releases_are_recorded_in_version_order_without_pre_releases_or_yanked_ones(
    factory: sessionmaker[Session], index: PackageIndex, policy: CommitPolicy
) -> None:
    for version in ("1.2", "1.10", "1.9", "2.0rc1", "2.1.dev0", "1.9.post1"):
        index.publish("Toy_Lib", version)
    index.publish("toy-lib", "1.11", yanked=True)
    index.release_without_files("toy-lib", "1.12")
    index.projects["toy-lib"]["not a version"] = []
    target_id = add_target(factory, "https://example.com/toy/toy-lib", name="toy-lib", install=InstallMode.pip, policy=policy)

    report = tasks.poll_releases()

    assert report["errors"] == {}
    assert "/pypi/toy-lib/json" in index.requests
    first = ["release:1.2", "release:1.9", "release:1.9.post1", "release:1.10"]
    assert release_shas(factory, target_id) == first
    assert [c.branch_order for c in recorded(factory, target_id, branch=None)] == [1, 2, 3, 4]
    assert list(runs(factory, target_id)) == ["release:1.10"]  # first sight: the newest release only
    assert enqueued() == report["runs"]
    assert state(factory, target_id, "toy-lib").head == "release:1.10"

    time_passes(factory)
    assert tasks.poll_releases() == {"polled": ["toy-lib"], "runs": [], "errors": {}}  # idempotent

    index.publish("toy-lib", "1.9.1", uploaded="2026-02-01T00:00:00Z")  # a backport, after 1.10
    index.publish("toy-lib", "2.0")
    time_passes(factory)
    report = tasks.poll_releases()

    assert release_shas(factory, target_id) == [
        "release:1.2",
        "release:1.9",
        "release:1.9.post1",
        "release:1.9.1",
        "release:1.10",
        "release:2.0",
    ]
    tested = ["release:1.9.1", "release:2.0"] if policy is CommitPolicy.every else ["release:2.0"]
    by_sha = runs(factory, target_id)
    assert list(by_sha) == ["release:1.10", *tested]
    assert report["runs"] == [by_sha[sha].id for sha in tested]
    assert enqueued()[-len(tested) :] == report["runs"]
    backport = next(c for c in recorded(factory, target_id, branch=None) if c.sha == "release:1.9.1")
    assert backport.committed_at is not None
    assert backport.committed_at.isoformat() == "2026-02-01T00:00:00+00:00"
    assert state(factory, target_id, "toy-lib").head == "release:2.0"


def test_an_index_error_keeps_the_state_and_is_retried_next_poll(factory: sessionmaker[Session], index: PackageIndex) -> None:
    index.publish("toy-lib", "1.0")
    target_id = add_target(factory, "https://example.com/toy/toy-lib", name="toy-lib", install=InstallMode.pip)
    index.failing_with = 503

    report = tasks.poll_releases()

    assert report["runs"] == []
    assert report["errors"] == {"toy-lib/toy-lib": f"GET {index.url}/pypi/toy-lib/json: HTTP 503"}
    assert release_shas(factory, target_id) == []
    assert state(factory, target_id, "toy-lib").error == report["errors"]["toy-lib/toy-lib"]

    index.failing_with = None
    time_passes(factory)
    report = tasks.poll_releases()

    assert report["errors"] == {}
    assert release_shas(factory, target_id) == ["release:1.0"]
    assert state(factory, target_id, "toy-lib").error is None


def test_an_unreachable_index_raises_nothing(factory: sessionmaker[Session], index: PackageIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    add_target(factory, "https://example.com/toy/toy-lib", name="toy-lib", install=InstallMode.pip)
    monkeypatch.setenv("SPECWATCH_WORKER_PYPI_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    get_worker_settings.cache_clear()

    report = tasks.poll_releases()

    assert report["polled"] == ["toy-lib"]
    assert "ConnectError" in report["errors"]["toy-lib/toy-lib"]


def test_a_pip_target_without_a_poll_interval_is_polled_at_the_default(
    factory: sessionmaker[Session], index: PackageIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    index.publish("toy-lib", "1.0")
    add_target(factory, "https://example.com/toy/toy-lib", name="toy-lib", install=InstallMode.pip, poll_s=None)

    assert tasks.poll_releases()["polled"] == ["toy-lib"]
    assert tasks.poll_releases()["polled"] == []
    with session_scope(factory) as session:
        for polled in session.scalars(select(PollState)):
            assert polled.polled_at is not None
            polled.polled_at -= timedelta(seconds=3600)
    assert tasks.poll_releases()["polled"] == ["toy-lib"]


def test_a_removed_remote_mirror_is_cloned_again(factory: sessionmaker[Session], tmp_path: Path) -> None:
    remote = Remote.create(tmp_path)
    target_id = add_target(factory, remote.url, policy=CommitPolicy.every)
    tasks.poll_branches()
    shutil.rmtree(tmp_path / "mirrors")
    new = remote.commit("after the mirror was lost")
    remote.push()
    time_passes(factory)

    tasks.poll_branches()

    assert recorded(factory, target_id)[-1].sha == new


def test_the_pollers_work_on_the_embedded_sqlite_database(tmp_path: Path) -> None:
    """``specwatch serve`` runs beat on SQLite: the same claim, record and enqueue-after-commit path."""
    url = f"sqlite:///{tmp_path / 'specwatch.db'}"
    migrate(url)
    remote = Remote.create(tmp_path)
    sent: list[list[int]] = []
    options = RunOptions(profile="smoke", queued_lease=timedelta(minutes=5))
    with session_maker(url) as factory, serve(PackageIndex()) as index:
        index.publish("toy-lib", "1.0")
        branch_target = add_target(factory, remote.url, policy=CommitPolicy.every)
        release_target = add_target(factory, "https://example.com/toy/toy-lib", name="toy-lib", install=InstallMode.pip)
        mirrors = MirrorCache(tmp_path / "sqlite-mirrors", policy=RepoPolicy(allow_local=True))

        pollers.poll_branches(factory, mirrors=mirrors, options=options, enqueue=sent.append)
        pollers.poll_releases(factory, index_url=index.url, options=options, enqueue=sent.append)
        new = remote.commit("on sqlite")
        remote.push()
        later = datetime.now(UTC) + timedelta(days=1)
        report = pollers.poll_branches(factory, mirrors=mirrors, options=options, enqueue=sent.append, now=later)

        assert report.errors == {}
        assert [c.sha for c in recorded(factory, branch_target)][-1] == new
        assert release_shas(factory, release_target) == ["release:1.0"]
        queued = [*runs(factory, branch_target).values(), *runs(factory, release_target).values()]
        assert sorted(run_id for batch in sent for run_id in batch) == sorted(run.id for run in queued)
        assert len(queued) == 3
