"""Cleaning up after an earlier attempt whose mirror or worktree is missing is a no-op (issue 42, item 1)."""

from __future__ import annotations

from pathlib import Path

from workers.checkout import MirrorCache
from workers.execution import _remove_earlier_attempts

REPO = "https://github.com/octo-org/toy-sampler.git"


def test_a_leftover_whose_mirror_was_never_cloned_is_removed_without_running_git(tmp_path: Path) -> None:
    """The first attempt died before its mirror existed (or the mirror was removed): before issue 42 git ran in the
    missing mirror folder and the FileNotFoundError crashed every attempt of the run."""
    scratch, mirrors = tmp_path / "scratch", MirrorCache(tmp_path / "mirrors")
    leftover = scratch / "run-1-attempt-1" / "checkout"
    leftover.mkdir(parents=True)
    (leftover / "file").write_text("left behind")
    other_run = scratch / "run-12-attempt-1"
    other_run.mkdir()

    _remove_earlier_attempts(scratch, 1, mirrors, REPO)

    assert sorted(p.name for p in scratch.iterdir()) == ["run-12-attempt-1"]
    assert not (tmp_path / "mirrors").exists()  # nothing made for a mirror that is not there


def test_removing_a_worktree_that_is_gone_from_a_missing_mirror_does_nothing(tmp_path: Path) -> None:
    MirrorCache(tmp_path / "mirrors").remove_worktree(REPO, tmp_path / "never-made")

    assert list(tmp_path.iterdir()) == []
