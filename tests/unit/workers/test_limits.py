"""workers.limits against real processes: a tree's processes and threads, its memory in all, the launcher."""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from specwatch.sandbox import LAUNCHER, Sandbox, with_limits
from workers.limits import RunLimits, over_limit, tasks, tree

pytestmark = pytest.mark.unit

# A parent that starts ``n`` children, each holding ``mb`` megabytes (written: resident), then waits on stdin.
HOLDERS = """
import os, sys
n, mb = int(sys.argv[1]), int(sys.argv[2])
for _ in range(n):
    if os.fork() == 0:
        held = b"x" * (mb * 1_000_000)
        os.write(1, b"ready\\n")
        sys.stdin.read()
        os._exit(0)
sys.stdin.read()
"""


@contextmanager
def holders(n: int, mb: int) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDERS, str(n), str(mb)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for _ in range(n):
            assert proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()


def test_the_tree_counts_the_children_and_their_threads() -> None:
    with holders(3, 1) as proc:
        pids = tree(proc.pid)
        assert len(pids) == 4
        assert tasks(pids) == 4
        assert over_limit(proc.pid, RunLimits(max_processes=4)) == "its limit of 4 processes and threads"
        assert over_limit(proc.pid, RunLimits(max_processes=5)) is None


def test_memory_is_summed_over_the_tree() -> None:
    with holders(3, 60) as proc:
        # Each child holds 60 MB: no one process is over 100 MiB, the three together are.
        reached = over_limit(proc.pid, RunLimits(memory_total_bytes=100 * 1024 * 1024))
        assert reached is not None
        assert reached.startswith("its memory limit of 100 MiB for all its processes (")
        assert over_limit(proc.pid, RunLimits(memory_total_bytes=2000 * 1024 * 1024)) is None


def test_no_limits_cost_nothing() -> None:
    assert over_limit(1, RunLimits()) is None


def test_the_launcher_sets_rlimit_nproc_and_rlimit_as_then_runs_the_command() -> None:
    script = "import resource as r; print(r.getrlimit(r.RLIMIT_NPROC), r.getrlimit(r.RLIMIT_AS))"
    argv = with_limits([sys.executable, "-c", script], sys.executable, 77, 8 * 1024**3)
    assert argv[:5] == [sys.executable, "-c", LAUNCHER, "77", str(8 * 1024**3)]
    assert subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip() == f"(77, 77) ({8 * 1024**3}, {8 * 1024**3})"
    nproc_only = with_limits([sys.executable, "-c", script], sys.executable, 77)
    assert (
        subprocess.run(nproc_only, capture_output=True, text=True, check=True).stdout.strip()
        == f"(77, 77) {resource.getrlimit(resource.RLIMIT_AS)}"
    )
    assert with_limits(["x"], sys.executable, None) == ["x"]


def test_a_root_worker_starts_bubblewrap_as_the_sandbox_uid_where_it_can() -> None:
    assert Sandbox("bwrap", drop_uid=True).switches_uid
    assert not Sandbox("bwrap").switches_uid
