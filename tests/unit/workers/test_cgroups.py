"""workers.cgroups.remove_stale_groups over a plain folder standing in for a cgroup parent: the groups of a worker
that is gone are removed, a live worker's and anything else stay."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.cgroups import remove_stale_groups

pytestmark = pytest.mark.unit


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def test_the_groups_of_a_worker_that_is_gone_are_removed_and_the_rest_stay(tmp_path: Path) -> None:
    stale = tmp_path / f"specwatch-suite-{_dead_pid()}-0badcafe"
    live = tmp_path / f"specwatch-suite-{os.getpid()}-12345678"
    other = tmp_path / "user.slice"
    unnamed = tmp_path / "specwatch-suite-notapid-12345678"
    for folder in (stale, live, other, unnamed):
        folder.mkdir()

    assert remove_stale_groups(tmp_path) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (live, other, unnamed))


def test_a_stale_group_that_cannot_be_removed_is_left_and_not_reported(tmp_path: Path) -> None:
    stale = tmp_path / f"specwatch-suite-{_dead_pid()}-0badcafe"
    stale.mkdir()
    (stale / "not-a-cgroup-file").write_text("x")  # a plain folder with content: rmdir fails, as for a busy group

    assert remove_stale_groups(tmp_path) == []
    assert stale.exists()
