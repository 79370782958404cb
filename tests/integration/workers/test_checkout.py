"""workers.checkout against real git repositories: mirror once, fetch on demand, worktrees always removed."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from service.repositories import RepoPolicy
from tests.support.toy_target import CORRECT, SWAPPED_RESIDUAL, ToyRepo, git
from workers.checkout import CheckoutError, CommitNotFoundError, MirrorCache, ls_remote

# The toy repositories are local: the policy of SPECWATCH_ALLOW_LOCAL_REPOSITORIES=true.
LOCAL = RepoPolicy(allow_local=True)


def worktrees(cache: MirrorCache, repo: ToyRepo) -> list[str]:
    listing = git(cache.mirror_path(repo.url), "worktree", "list", "--porcelain")
    return [line.removeprefix("worktree ") for line in listing.splitlines() if line.startswith("worktree ")]


def test_a_worktree_holds_the_commit_and_is_removed_after(tmp_path: Path, toy_repo: ToyRepo) -> None:
    good = toy_repo.commit(CORRECT, "good")
    bad = toy_repo.commit(SWAPPED_RESIDUAL, "bad")
    cache = MirrorCache(tmp_path / "mirrors", policy=LOCAL)

    with cache.worktree(toy_repo.url, good, tmp_path / "run-1" / "checkout") as checkout:
        assert (checkout / "src" / "toy_lib" / "sampler.py").read_text() == CORRECT
        assert git(checkout, "rev-parse", "HEAD") == good
        assert len(worktrees(cache, toy_repo)) == 2
    with cache.worktree(toy_repo.url, bad[:12], tmp_path / "run-2" / "checkout") as checkout:
        assert (checkout / "src" / "toy_lib" / "sampler.py").read_text() == SWAPPED_RESIDUAL

    assert not (tmp_path / "run-1" / "checkout").exists()
    assert not (tmp_path / "run-2" / "checkout").exists()
    assert worktrees(cache, toy_repo) == [str(cache.mirror_path(toy_repo.url))]
    assert git(cache.mirror_path(toy_repo.url), "rev-parse", "--is-bare-repository") == "true"


def test_the_worktree_is_removed_when_the_run_fails(tmp_path: Path, toy_repo: ToyRepo) -> None:
    sha = toy_repo.commit(CORRECT, "good")
    cache = MirrorCache(tmp_path / "mirrors", policy=LOCAL)
    dest = tmp_path / "run" / "checkout"

    with pytest.raises(RuntimeError, match="suite blew up"), cache.worktree(toy_repo.url, sha, dest):
        raise RuntimeError("suite blew up")

    assert not dest.exists()
    assert worktrees(cache, toy_repo) == [str(cache.mirror_path(toy_repo.url))]


def test_the_mirror_is_cloned_once_then_fetched_for_new_commits(tmp_path: Path, toy_repo: ToyRepo) -> None:
    first = toy_repo.commit(CORRECT, "first")
    cache = MirrorCache(tmp_path / "mirrors", policy=LOCAL)
    with cache.worktree(toy_repo.url, first, tmp_path / "a"):
        pass
    mirror = cache.mirror_path(toy_repo.url)
    marker = mirror / "specwatch-marker"
    marker.write_text("the same mirror, not a new clone")

    second = toy_repo.commit(SWAPPED_RESIDUAL, "second")
    with cache.worktree(toy_repo.url, second, tmp_path / "b") as checkout:
        assert (checkout / "src" / "toy_lib" / "sampler.py").read_text() == SWAPPED_RESIDUAL

    assert marker.exists()
    assert list((tmp_path / "mirrors").glob("*.git")) == [mirror]


def test_a_commit_that_does_not_exist_is_a_clear_error(tmp_path: Path, toy_repo: ToyRepo) -> None:
    toy_repo.commit(CORRECT, "good")
    cache = MirrorCache(tmp_path / "mirrors", policy=LOCAL)
    missing = "0123456789abcdef0123456789abcdef01234567"

    with (
        pytest.raises(CommitNotFoundError, match=f"commit {missing} does not exist in {toy_repo.url}"),
        cache.worktree(toy_repo.url, missing, tmp_path / "run" / "checkout"),
    ):
        pytest.fail("no worktree for a missing commit")

    assert not (tmp_path / "run" / "checkout").exists()


@pytest.mark.parametrize("sha", ["--upload-pack=touch /tmp/pwned", "HEAD", "main", "abc"])
def test_only_hex_commit_ids_reach_git(tmp_path: Path, toy_repo: ToyRepo, sha: str) -> None:
    toy_repo.commit(CORRECT, "good")
    with (
        pytest.raises(CheckoutError, match="is not a commit id"),
        MirrorCache(tmp_path / "m", policy=LOCAL).worktree(toy_repo.url, sha, tmp_path / "w"),
    ):
        pass


def test_an_unreachable_repository_is_a_clear_error(tmp_path: Path) -> None:
    with (
        pytest.raises(CheckoutError, match="git clone failed") as caught,
        MirrorCache(tmp_path / "m", policy=LOCAL).worktree(str(tmp_path / "nowhere"), "a" * 40, tmp_path / "w"),
    ):
        pass
    assert str(caught.value) == "git clone failed (exit 128): repository not found or not accessible"
    assert caught.value.transient is False  # says something about the repository: recorded, not retried


def test_a_remote_that_cannot_be_reached_is_transient(tmp_path: Path) -> None:
    """The source cannot be fetched right now: the run is retried later like a release that cannot be installed."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    policy = RepoPolicy(protocols=frozenset({"http"}), allow_private_hosts=True)
    with (
        pytest.raises(CheckoutError) as caught,
        MirrorCache(tmp_path / "m", policy=policy).worktree(f"http://127.0.0.1:{port}/toy.git", "a" * 40, tmp_path / "w"),
    ):
        pass
    assert str(caught.value) == "git clone failed (exit 128): could not connect"
    assert caught.value.transient is True


def test_git_errors_do_not_tell_which_paths_exist(tmp_path: Path) -> None:
    """git's own messages differ for /root (exists, not a repository) and a missing path: the summary does not."""
    errors = []
    for path in ("/root", "/etc", str(tmp_path / "nowhere")):
        with pytest.raises(CheckoutError) as caught, MirrorCache(tmp_path / "m", policy=LOCAL).worktree(path, "a" * 40, tmp_path / "w"):
            pass
        errors.append(str(caught.value))
    assert len(set(errors)) == 1
    assert "/root" not in errors[0]


def test_the_strict_policy_refuses_local_repositories_before_git_runs(tmp_path: Path, toy_repo: ToyRepo) -> None:
    sha = toy_repo.commit(CORRECT, "good")
    with (
        pytest.raises(CheckoutError, match="local repositories are not allowed"),
        MirrorCache(tmp_path / "m").worktree(toy_repo.url, sha, tmp_path / "w"),
    ):
        pass
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").glob("*.git"))
    with pytest.raises(CheckoutError, match="local repositories are not allowed"):
        ls_remote(toy_repo.url, ["main"])


def test_git_itself_refuses_protocols_outside_the_policy(tmp_path: Path, toy_repo: ToyRepo) -> None:
    """Even past the URL check (a file:// URL with local repositories allowed, but git told https only)."""
    from workers.checkout import git as run_git

    toy_repo.commit(CORRECT, "good")
    with pytest.raises(CheckoutError, match="protocol not allowed"):
        run_git("ls-remote", "--", f"file://{toy_repo.url}", policy=RepoPolicy())
    assert run_git("ls-remote", "--", f"file://{toy_repo.url}", policy=LOCAL)
