"""How many processes and how much memory a suite run may use in all (issue 28, item 4).

``RLIMIT_AS`` (:mod:`workers.sandbox`) bounds each process, not a run: two processes of 16 GiB exhaust a 24 GiB
host, and nothing bounded the number of processes (200 forks succeeded). A run now has two limits, both
enforced in two ways:

- **Processes and threads** (``sandbox_max_processes``): ``RLIMIT_NPROC``, which the kernel counts per user
  (and per user namespace): set inside bubblewrap's user namespace by :data:`specwatch.sandbox.LAUNCHER` (it then counts
  only the sandbox's own tasks), and on the suite itself in ``uid`` mode (it counts every process of the
  sandbox uid). A fork past it fails (``EAGAIN``). The kernel exempts tasks of root, so a root worker starts
  bubblewrap as the sandbox uid (:class:`specwatch.sandbox.Sandbox`, ``drop_uid``). The supervisor
  (:func:`over_limit`) also ends a run whose processes and threads reach the limit: a fork bomb that retries
  its failed forks would otherwise spin until the wall-clock limit.
- **Memory, all processes together** (``memory_total_limit_mb``): the supervisor sums the resident memory of
  the run's process tree every poll (proportional set size, so pages shared by forked children count once)
  and ends the run past the limit. It polls, so a run may briefly exceed it by what one process can allocate
  between two polls, itself bounded by ``RLIMIT_AS``.

A run ended by a limit is an error that names it (:func:`workers.execution.interpret`); the worker goes on.
Without bubblewrap and without a uid switch (``SPECWATCH_WORKER_SANDBOX=off``) there is no ``RLIMIT_NPROC``
(it would count the worker's own processes): only the supervisor's limits apply.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class RunLimits:
    """A run's limits in all: processes and threads (None: none), and memory in bytes (None: none)."""

    max_processes: int | None = None
    memory_total_bytes: int | None = None


def _children() -> dict[int, list[int]]:
    """Every visible process's children (from ``/proc/<pid>/stat``'s parent pid)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            children[int(fields[1])].append(int(entry.name))
    return children


def tree(root: int) -> list[int]:
    """``root`` and its descendants now (under bubblewrap an orphan is adopted by the sandbox's init, so stays)."""
    children = _children()
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _status(pid: int) -> dict[str, str]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {name: value.strip() for name, _, value in (line.partition(":") for line in lines)}


def tasks(pids: Iterable[int]) -> int:
    """Processes and threads of ``pids`` (what ``RLIMIT_NPROC`` counts)."""
    return sum(int(_status(pid).get("Threads", "0") or 0) for pid in pids)


def resident_bytes(pids: Iterable[int]) -> int:
    """The sum of the resident sets of ``pids`` (pages shared between them counted once per process)."""
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


def proportional_bytes(pids: Iterable[int]) -> int:
    """The sum of the proportional set sizes of ``pids`` (``smaps_rollup``: a shared page split among its users)."""
    total = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
                break
    return total


def over_limit(root: int, limits: RunLimits) -> str | None:
    """Which of ``limits`` the process tree of ``root`` is at or over now, in words; None: neither."""
    if limits.max_processes is None and limits.memory_total_bytes is None:
        return None
    pids = tree(root)
    if limits.max_processes is not None and tasks(pids) >= limits.max_processes:
        return f"its limit of {limits.max_processes} processes and threads"
    # The resident sets first (cheap); only when they exceed the limit, the proportional sizes (shared pages once).
    if limits.memory_total_bytes is not None and resident_bytes(pids) > limits.memory_total_bytes:
        used = proportional_bytes(pids)
        if used > limits.memory_total_bytes:
            mib = 1024 * 1024
            return f"its memory limit of {limits.memory_total_bytes // mib} MiB for all its processes ({used // mib} MiB used)"
    return None
