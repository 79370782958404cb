"""One subprocess of a run (an install step or the suite), supervised: started in its own session under the run's
limits (:mod:`workers.limits`, a control group where the worker can make one), killed with its whole group at the
deadline, an abort or a limit, and dying with its worker (``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from specwatch.sandbox import Sandbox
from workers.cgroups import RunCgroup, make_run_cgroup
from workers.limits import RunLimits, over_limit

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_POLL_S = 0.2


@lru_cache(maxsize=1)
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _child_setup(
    memory_limit_bytes: int | None, parent_pid: int, max_processes: int | None = None, join: Callable[[], None] | None = None
) -> Callable[[], None]:
    """What the child does between fork and exec: join its control group (``join``), limit its memory (and its
    uid's processes and threads), die with its parent."""
    libc = _libc() if sys.platform == "linux" else None  # loaded before the fork, not in the child

    def setup() -> None:
        if join is not None:
            join()
        if memory_limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
        if max_processes is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent_pid:  # the parent died before prctl took effect
                os._exit(1)

    return setup


def make_non_dumpable() -> None:
    """``prctl(PR_SET_DUMPABLE, 0)`` on this process (Linux): its ``/proc/<pid>/environ``, ``mem`` and ``maps``
    become root's, and no process of its own uid may ptrace it. Idempotent; kept across fork, reset by exec
    (the suite's own process is dumpable again, which exposes only its own clean environment)."""
    if sys.platform == "linux":
        _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@dataclass
class Step:
    """One subprocess of a run (install or test), supervised until it exits, the deadline, an abort or one of the
    run's limits (then :attr:`limit` says which, and the step's status is None)."""

    env: dict[str, str]
    cwd: Path
    out: Any
    err: Any
    sandbox: Sandbox
    memory: int | None
    spawn_lock: threading.Lock | None
    limits: RunLimits = field(default_factory=RunLimits)
    nproc: int | None = None  # RLIMIT_NPROC set on the child itself (uid mode)
    limit: str | None = None

    def run(self, argv: list[str], deadline: float, should_abort: Callable[[], bool]) -> tuple[int | None, bool, bool]:
        """(exit status, timed out, aborted) of ``argv``; the status is None when we killed it."""
        guard: AbstractContextManager[Any] = self.spawn_lock if self.spawn_lock is not None else nullcontext()
        as_user: dict[str, Any] = (
            {"user": self.sandbox.uid, "group": self.sandbox.gid, "extra_groups": []} if self.sandbox.switches_uid else {}
        )
        # The kernel's limits on the step's processes and memory in all, where the worker can make a cgroup.
        group = make_run_cgroup(self.limits.max_processes, self.limits.memory_total_bytes)
        try:
            with guard:
                proc = subprocess.Popen(  # noqa: S603 -- our interpreter and arguments, no shell
                    argv,
                    cwd=self.cwd,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=self.out,
                    stderr=self.err,
                    start_new_session=True,
                    preexec_fn=_child_setup(self.memory, os.getpid(), self.nproc, group.joiner() if group else None),  # noqa: PLW1509 -- fork happens under spawn_lock
                    **as_user,
                )
            if group is not None:
                group.close_fds()
            return self._supervise(proc, group, deadline, should_abort)
        finally:
            if group is not None:
                group.close_fds()
                group.remove()

    def _reached(self, proc: subprocess.Popen[bytes], group: RunCgroup | None) -> str | None:
        """The limit the step reached (the kernel refused a fork, or the supervisor counts too much), if any."""
        if group is not None and group.refused_a_fork():
            return f"its limit of {self.limits.max_processes} processes and threads"
        if group is not None and group.killed_for_memory():
            return self._memory_limit()
        return over_limit(proc.pid, self.limits)

    def _memory_limit(self) -> str:
        return f"its memory limit of {(self.limits.memory_total_bytes or 0) // (1024 * 1024)} MiB for all its processes"

    def _supervise(
        self, proc: subprocess.Popen[bytes], group: RunCgroup | None, deadline: float, should_abort: Callable[[], bool]
    ) -> tuple[int | None, bool, bool]:
        timed_out = aborted = False
        try:
            while True:
                try:
                    proc.wait(timeout=max(0.0, min(_POLL_S, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    if should_abort():
                        aborted = True
                    elif time.monotonic() >= deadline:
                        timed_out = True
                    elif (reached := self._reached(proc, group)) is not None:
                        self.limit = reached
                    else:
                        continue
                    _kill_group(proc)
                    break
        finally:
            if proc.poll() is None:  # interrupted (soft time limit, shutdown): leave nothing running
                _kill_group(proc)
        if self.limit is None and group is not None and group.killed_for_memory():
            self.limit = self._memory_limit()
        return (None if timed_out or aborted or self.limit else proc.returncode), timed_out, aborted
