"""A control group per suite step, where the worker can make one: the kernel's own limits on a run's processes
and memory in all (issue 28, item 4; :mod:`workers.limits` has the rest).

cgroup v2 (``/sys/fs/cgroup/cgroup.controllers``): a child of the worker's own group with ``pids.max``,
``memory.max`` and ``memory.swap.max = 0``; the worker's group must delegate the ``pids`` and ``memory``
controllers (``cgroup.subtree_control``), as systemd's ``Delegate=yes`` or a container with its own cgroup
namespace and a writable ``/sys/fs/cgroup`` give. cgroup v1: a child of the worker's group in the ``pids`` and
``memory`` hierarchies (``pids.max``, ``memory.limit_in_bytes``, and ``memory.memsw.limit_in_bytes`` where swap
is accounted). Either needs write access there (root, or a delegated group); elsewhere :func:`make_run_cgroup`
returns None and only the rlimits and the supervisor's limits apply.

The suite joins its group between fork and exec (:meth:`RunCgroup.joiner`: it writes ``0`` to ``cgroup.procs``
through a descriptor the worker opened, then closes it), so nothing it starts is ever outside it. At the end
:meth:`RunCgroup.remove` kills what is left in the group and removes it. A worker killed before that leaves its
group behind: the next group made beside it removes it (:func:`remove_stale_groups`, by the dead worker's pid in
the name).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIX = "specwatch-suite-"
# A step's group is named after the worker that made it: specwatch-suite-<worker pid>-<random>.
_OWNER = re.compile(rf"^{PREFIX}(\d+)-[0-9a-f]+$")


@dataclass
class RunCgroup:
    """The group(s) of one suite step: one folder on cgroup v2, one per hierarchy (pids, memory) on v1."""

    folders: tuple[Path, ...]
    version: int
    _fds: list[int] = field(default_factory=list)

    def joiner(self) -> Callable[[], None]:
        """Opened now (by the worker), called in the child between fork and exec: the child joins every folder
        and closes the descriptors (the code under test never holds one). The worker's copies: :meth:`close_fds`."""
        self._fds = [os.open(folder / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) for folder in self.folders]
        fds = list(self._fds)

        def join() -> None:
            for fd in fds:
                os.write(fd, b"0")
                os.close(fd)

        return join

    def close_fds(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []

    def _counter(self, file: str, key: str) -> int:
        for folder in self.folders:
            with contextlib.suppress(OSError, ValueError):
                for line in (folder / file).read_text().splitlines():
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        return 0

    def refused_a_fork(self) -> bool:
        """Whether the kernel refused a fork for the process limit (``pids.events``: ``max``)."""
        return self._counter("pids.events", "max") > 0

    def killed_for_memory(self) -> bool:
        """Whether the kernel killed a process of the group for its memory limit (``oom_kill``)."""
        return self._counter("memory.events", "oom_kill") > 0 or self._counter("memory.oom_control", "oom_kill") > 0

    def remove(self, wait_s: float = 10.0) -> bool:
        """Kill whatever is left in the group(s), wait until it is gone (at most ``wait_s``), remove the folders;
        whether they are gone (a group that cannot be removed yet is logged and left)."""
        end = time.monotonic() + wait_s
        for folder in self.folders:
            kill = folder / "cgroup.kill"
            if kill.exists():
                with contextlib.suppress(OSError):
                    kill.write_text("1")
            while True:
                try:
                    pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                if not pids or time.monotonic() > end:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.02)  # killed processes leave the group once the kernel has torn them down
            with contextlib.suppress(FileNotFoundError):
                try:
                    folder.rmdir()
                except OSError as exc:
                    log.warning("cgroup_not_removed folder=%s error=%s", folder, exc)
        return not any(folder.exists() for folder in self.folders)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_groups(parent: Path) -> list[Path]:
    """Remove the step groups under ``parent`` whose worker is gone (killed before it could remove them), with
    whatever they still hold; the groups removed. A live worker's groups, and anything not named by a worker, stay."""
    removed = []
    with contextlib.suppress(OSError):
        for folder in parent.iterdir():
            owner = _OWNER.match(folder.name)
            if owner and folder.is_dir() and not _alive(int(owner.group(1))) and RunCgroup((folder,), 0).remove(wait_s=1.0):
                log.info("cgroup_stale_removed folder=%s", folder)
                removed.append(folder)
    return removed


def _own_paths() -> dict[str, str]:
    """The worker's group per hierarchy: ``""`` for cgroup v2's unified one, else the controller names."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _v2(own: str, name: str, max_processes: int | None, memory_bytes: int | None) -> RunCgroup | None:
    parent = CGROUP_ROOT / own.lstrip("/")
    wanted = {c for c, limit in (("pids", max_processes), ("memory", memory_bytes)) if limit is not None}
    try:
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        if not wanted <= enabled:
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(wanted - enabled)))
        remove_stale_groups(parent)
        folder = parent / name
        folder.mkdir()
    except OSError as exc:
        log.info("cgroup_unavailable version=2 parent=%s error=%s", parent, exc)
        return None
    group = RunCgroup((folder,), 2)
    try:
        if max_processes is not None:
            _write(folder / "pids.max", str(max_processes))
        if memory_bytes is not None:
            _write(folder / "memory.max", str(memory_bytes))
            if (folder / "memory.swap.max").exists():
                _write(folder / "memory.swap.max", "0")
    except OSError as exc:
        log.info("cgroup_unavailable version=2 folder=%s error=%s", folder, exc)
        group.remove()
        return None
    return group


def _v1(own: dict[str, str], name: str, max_processes: int | None, memory_bytes: int | None) -> RunCgroup | None:
    limits = {
        "pids": [("pids.max", max_processes)],
        "memory": [("memory.limit_in_bytes", memory_bytes), ("memory.memsw.limit_in_bytes", memory_bytes)],
    }
    needed = [controller for controller, files in limits.items() if any(value is not None for _, value in files)]
    if missing := [controller for controller in needed if controller not in own]:
        log.info("cgroup_unavailable version=1 missing=%s", ",".join(missing))
        return None
    folders: list[Path] = []
    group = RunCgroup((), 1)
    try:
        for controller in needed:
            files = limits[controller]
            parent = CGROUP_ROOT / controller / own[controller].lstrip("/")
            remove_stale_groups(parent)
            folder = parent / name
            folder.mkdir()
            folders.append(folder)
            group = RunCgroup(tuple(folders), 1)
            for file, value in files:
                if value is not None and (folder / file).exists():
                    _write(folder / file, str(value))
    except OSError as exc:
        log.info("cgroup_unavailable version=1 error=%s", exc)
        group.remove()
        return None
    return group


def make_run_cgroup(max_processes: int | None, memory_bytes: int | None) -> RunCgroup | None:
    """A new group for one suite step with these limits, or None where the worker cannot make one here."""
    if max_processes is None and memory_bytes is None:
        return None
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    own = _own_paths()
    if (CGROUP_ROOT / "cgroup.controllers").exists() and "" in own:
        return _v2(own[""], name, max_processes, memory_bytes)
    return _v1(own, name, max_processes, memory_bytes)
