"""A suite run's processes and memory are limited in all (issue 28, item 4): a fork bomb and an over-allocation
each end their run as an error that names the limit, and the same worker then tests the next commit.

A real worker process (as in ``test_sandbox_probes``) runs two commits of the toy library in a row under
bubblewrap: first a sampler that forks without end (or whose processes allocate more than the run's memory
limit in all, each one well under the per-process ``RLIMIT_AS``), then the correct sampler. Before issue 28
200 forks succeeded and only ``RLIMIT_AS`` per process bounded memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from service.models import Run
from specwatch.sandbox import resolve_sandbox
from tests.support.postgres import migrate
from tests.support.toy_target import ADAPTER, CORRECT, ToyRepo
from tests.support.workers import add_runs, flush_redis, session_maker, worker_environment
from workers.cgroups import CGROUP_ROOT, make_run_cgroup

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MAX_PROCESSES = 48

FORK_BOMB = """
import os as _os
while True:  # every process forks again, and retries a fork that failed
    try:
        _os.fork()
    except OSError:
        pass
"""

# 4 processes of 400 MB each (written, so resident): 1.6 GB in all, each far below RLIMIT_AS (8 GiB here).
OVER_ALLOCATION = """
import os as _os
import time as _time
for _ in range(3):
    if _os.fork() == 0:
        break
_held = b"x" * 400_000_000
_time.sleep(600)
"""


def _sampler_with(prefix: str) -> str:
    return CORRECT.replace("import torch\n", "import torch\n" + prefix, 1)


def run_two(tmp_path: Path, hostile: str, **worker: str) -> tuple[Run, Run, int]:
    """The hostile commit, then the correct one, run by one worker process under bubblewrap; both runs and the
    worker's pid (its steps' cgroups are named after it)."""
    database = tmp_path / "specwatch.db"
    url = f"sqlite:///{database}"
    migrate(url)
    repo = ToyRepo.create(tmp_path / "toy")
    bad = repo.commit(_sampler_with(hostile), "a hostile sampler")
    good = repo.commit(CORRECT, "the correct sampler")
    with session_maker(url) as factory:
        first, second = add_runs(factory, repo.url, [bad, good], adapter=ADAPTER)
    env = {name: value for name, value in os.environ.items() if not name.startswith("SPECWATCH_")}
    env |= worker_environment(url, tmp_path, sandbox="bwrap", lease_s="60", heartbeat_s="5", **worker)
    script = (
        "import logging, sys; logging.basicConfig(level=logging.INFO); from workers import tasks; "
        "[print(tasks.run_suite(int(run_id))) for run_id in sys.argv[1:]]"
    )
    flush_redis()
    try:
        with subprocess.Popen(
            [sys.executable, "-c", script, str(first), str(second)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as worker_process:
            _, stderr = worker_process.communicate(timeout=600)
    finally:
        flush_redis()
    assert worker_process.returncode == 0, stderr[-3000:]  # the worker survived both
    with session_maker(url) as factory, factory() as session:
        runs = {run.id: run for run in session.scalars(select(Run))}
    return runs[first], runs[second], worker_process.pid


def _run_cgroups(worker_pid: int) -> set[Path]:
    """The step groups a worker made that are still there (other tests' workers may run beside this one)."""
    return set(Path("/sys/fs/cgroup").glob(f"**/specwatch-suite-{worker_pid}-*"))


def _left_running(tmp_path: Path) -> list[str]:
    """Processes whose command line names this test's folder (the suite's result file is in its scratch)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(tmp_path) in cmdline and int(pid) != os.getpid():
            found.append(cmdline)
    return found


@pytest.fixture(autouse=True)
def _enforced() -> None:
    """The probes run only where the kernel enforces the process limit (a fork bomb must never be unbounded): a
    cgroup the worker can make, or RLIMIT_NPROC in bubblewrap's user namespace (not for root's tasks)."""
    sandbox = resolve_sandbox("bwrap", sys.executable)
    assert sandbox.mode == "bwrap"
    group = make_run_cgroup(MAX_PROCESSES, None)
    if group is not None:
        group.remove()
    assert group is not None or os.geteuid() != 0 or sandbox.drop_uid, "no cgroup, and bubblewrap runs as root: no process limit"


def test_a_fork_bomb_ends_its_run_at_the_process_limit_and_the_worker_goes_on(tmp_path: Path) -> None:
    bomb, after, worker_pid = run_two(tmp_path, FORK_BOMB, sandbox_max_processes=str(MAX_PROCESSES))
    assert bomb.status.value == "error"
    assert bomb.error == f"the suite reached its limit of {MAX_PROCESSES} processes and threads and was killed"
    assert after.status.value == "passed", after.error
    assert _left_running(tmp_path) == []
    assert _run_cgroups(worker_pid) == set()  # each step's cgroup removed


def test_an_over_allocation_in_all_ends_its_run_at_the_memory_limit_and_the_worker_goes_on(tmp_path: Path) -> None:
    hog, after, worker_pid = run_two(tmp_path, OVER_ALLOCATION, memory_total_limit_mb="1200")
    assert hog.status.value == "error"
    assert hog.error is not None
    assert hog.error.startswith("the suite reached its memory limit of 1200 MiB for all its processes"), hog.error
    assert after.status.value == "passed", after.error
    assert _left_running(tmp_path) == []
    assert _run_cgroups(worker_pid) == set()  # each step's cgroup removed


def test_a_group_left_by_a_killed_worker_is_removed_when_the_next_one_is_made() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    group = make_run_cgroup(MAX_PROCESSES, None)
    assert group is not None, "this machine lets the worker make cgroups (the probes above need it)"
    try:
        # A real cgroup named after a worker that is gone, beside the new one (killed before it removed its group).
        stale = group.folders[0].parent / f"specwatch-suite-{gone.pid}-0badcafe"
        stale.mkdir()
    finally:
        group.remove()
    again = make_run_cgroup(MAX_PROCESSES, None)
    assert again is not None
    again.remove()
    assert not stale.exists()
    assert stale.is_relative_to(CGROUP_ROOT)
