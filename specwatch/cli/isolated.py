"""Where ``specwatch check`` runs the suite: in the worker's sandbox (:mod:`specwatch.sandbox`) by default, where
bubblewrap runs here, or as the caller (``--no-sandbox``, or bubblewrap missing: then it says so, loudly).

In the sandbox the code under test (a ``--pip`` release, a ``--source`` checkout, a ``--target module:function``
sampler) gets a clean environment (no ``SPECWATCH_*`` variable, no database URL, no token: only PATH, LANG, the
thread counts and, for the install step alone, pip's ``PIP_*`` settings), a scratch HOME, no network (a ``--pip``
release is installed first, in a step of its own that reaches only the package index (:mod:`specwatch.index_proxy`)
and writes only that release's cache entry; a llama.cpp ``--source`` checkout without changes is built first the
same way, reaching nothing, writing only its tree's entry, :func:`specwatch.sandbox.source_tree_entry`), and the
filesystem as read-only binds: the system, the interpreter, the ``specwatch`` package, the code under test and
the release cache. ``~/.ssh``, ``/etc/shadow``, the other processes' ``/proc/<pid>/environ`` are not there. Each
process is limited to :data:`MEMORY_LIMIT_BYTES` of address space, the sandbox's user namespace to
:data:`MAX_PROCESSES` processes and threads (``RLIMIT_NPROC``; the kernel does not count root's tasks, so a root
caller starts bubblewrap as uid 65534 where it can).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specwatch.index_proxy import forwarded, index_hosts, serving
from specwatch.protocol import ExitStatus
from specwatch.sandbox import (
    GPU_DEVICES,
    PACKAGE,
    Sandbox,
    bubblewrap,
    release_entries,
    source_tree_entry,
    suite_environment,
    with_limits,
)

#: The address space of each process of a sandboxed run (``RLIMIT_AS``), as the worker's default.
MEMORY_LIMIT_BYTES = 16 * 1024**3
#: Processes and threads of a sandboxed run in all (``RLIMIT_NPROC`` in its user namespace), as the worker's default.
MAX_PROCESSES = 512
#: Where the ``specwatch`` package is imported from inside the sandbox (only the package itself is bound there).
SPECWATCH_ROOT = PACKAGE.parent
#: The names copied into the suite's clean environment (every step), and into the install step only.
PASSTHROUGH = ("CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_PIP = re.compile(r"PIP_[A-Z_]+")


@dataclass(frozen=True)
class Plan:
    """The suite's command line(s) and environment: ``install`` (a ``--pip`` release in the sandbox) runs first."""

    sandbox: Sandbox
    command: list[str]
    env: dict[str, str]
    cwd: Path | None = None
    install: list[str] | None = None
    install_env: dict[str, str] = field(default_factory=dict)
    # Started as this (uid, gid) (a root caller's bubblewrap, so that its tasks count against RLIMIT_NPROC).
    user: tuple[int, int] | None = None
    # The install step's way to the package index (specwatch.index_proxy): its socket, the (host, port) it may reach.
    index_socket: Path | None = None
    index: frozenset[tuple[str, int]] = frozenset()

    @property
    def sandboxed(self) -> bool:
        return self.sandbox.mode == "bwrap"

    def popen_options(self) -> dict[str, Any]:
        """``subprocess`` options for every step: the uid to start as, when one."""
        return {"user": self.user[0], "group": self.user[1], "extra_groups": []} if self.user is not None else {}

    def describe(self) -> str:
        """One line for the table's title and the summary: which isolation the run had."""
        if self.sandboxed:
            gib = MEMORY_LIMIT_BYTES // 1024**3
            # The kernel does not count root's tasks: run as root without the uid switch, RLIMIT_NPROC does nothing.
            processes = f"{MAX_PROCESSES} processes" if os.geteuid() != 0 or self.user is not None else "no process limit (run as root)"
            return (
                f"sandboxed (bubblewrap: clean environment, no network after the install, read-only files, {processes}, "
                f"{gib} GiB per process)"
            )
        return f"NOT sandboxed ({self.sandbox.reason})"

    def as_json(self) -> dict[str, Any]:
        """What ``--json`` records of it: ``{"mode": "bwrap" | "none", "reason", "limits"}``."""
        processes = MAX_PROCESSES if os.geteuid() != 0 or self.user is not None else None  # None: root's tasks are not counted
        limits = {"max_processes": processes, "memory_per_process_bytes": MEMORY_LIMIT_BYTES} if self.sandboxed else None
        return {"mode": "bwrap" if self.sandboxed else "none", "reason": self.sandbox.reason, "limits": limits}


class SandboxRefusedError(Exception):
    """The sandbox cannot be built for these options without exposing what it should hide."""


def unsandboxed(command: list[str], reason: str) -> Plan:
    """The run as before the sandbox: the caller's whole environment, one thread per process."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return Plan(Sandbox("off", reason=reason), command, env)


def _inside_home(path: Path) -> bool:
    """Whether binding ``path`` would bind the caller's home (its ``.ssh``, its keys) into the sandbox."""
    home = Path.home().resolve()
    return home == path or home.is_relative_to(path)


def _existing(paths: Iterable[str]) -> list[Path]:
    return [Path(p).resolve() for p in paths if p and Path(p).exists()]


def plan(
    args: list[str],
    *,
    scratch: Path,
    pip: str | None,
    source: Path | None,
    target: str | None,
    gpu: bool,
    sandboxed: bool,
) -> Plan:
    """How to run ``python -m specwatch ARGS``: in the sandbox when ``sandboxed`` and bubblewrap works here (the
    fallback's reason said in :meth:`Plan.describe`), else as the caller. :class:`SandboxRefusedError` when the sandbox would
    have to bind the caller's home."""
    python = sys.executable
    command = [python, "-m", "specwatch", *args]
    if not sandboxed:
        return unsandboxed(command, "--no-sandbox")
    sandbox = bubblewrap(python, devices=GPU_DEVICES)
    if sandbox.mode != "bwrap":
        return unsandboxed(command, f"no sandbox here: {sandbox.reason}; --no-sandbox to say you mean it")
    read_only: list[Path] = []
    cwd = scratch
    user_path = _existing(os.environ.get("PYTHONPATH", "").split(os.pathsep))
    if source is not None and source.expanduser().is_dir():  # a missing one: the suite says so
        read_only.append(source.expanduser().resolve())
    if target is not None and ":" in target and not target.startswith("mutant:"):
        cwd = Path.cwd().resolve()  # python -m puts it first on sys.path: where a module:function target is found
        read_only.append(cwd)
    for path in [*read_only, *user_path]:
        if _inside_home(path):
            raise SandboxRefusedError(
                f"the sandbox would bind {path}, which holds your home directory (~/.ssh and all): run check from "
                "the folder of your code, or --no-sandbox"
            )
    home = scratch / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = suite_environment([*user_path, SPECWATCH_ROOT], home, PASSTHROUGH, os.environ)
    read_only += user_path
    install: list[str] | None = None
    install_env: dict[str, str] = {}
    index_socket: Path | None = None
    index: frozenset[tuple[str, int]] = frozenset()
    writable = [scratch]
    cache = Path(os.environ.get("SPECWATCH_CACHE_DIR") or Path.home() / ".cache" / "specwatch").expanduser().resolve()
    checkout = source.expanduser().resolve() if source is not None and pip is None else None
    tree = source_tree_entry(cache, checkout) if checkout is not None else None
    entries = release_entries(cache, pip) if pip is not None else [tree] if tree is not None else []
    if entries:
        for entry in entries:
            entry.mkdir(parents=True, exist_ok=True)
        env["SPECWATCH_CACHE_DIR"] = str(cache)
        # pip's settings for a release's install step; a checkout's build step reaches nothing (an empty allow-list).
        install_env = env | ({name: value for name, value in os.environ.items() if _PIP.fullmatch(name)} if pip else {})
        pip_paths = _existing(v.removeprefix("file://") for k, v in install_env.items() if _PIP.fullmatch(k) for v in v.split())
        index_socket = scratch / "index.sock"
        index = frozenset(index_hosts(install_env, python)) if pip else frozenset()
        step = forwarded(
            [python, "-m", "specwatch.targets.install", *([pip] if pip else ["--source", str(checkout)])], python, index_socket
        )
        install = sandbox.argv(
            with_limits(step, python, MAX_PROCESSES, MEMORY_LIMIT_BYTES),
            cwd=scratch,
            writable=[scratch, *entries],
            read_only=[*read_only, cache, *pip_paths],  # the cache read-only under the entry being built
            gpu=gpu,  # as the test: a build for this machine (llama.cpp's GGML_CUDA) looks for its GPU
        )
        read_only.append(cache)
    user = None
    if sandbox.drop_uid:
        user = (sandbox.uid, sandbox.gid)
        for path in (scratch, home, *entries):
            os.chown(path, *user)
    argv = sandbox.argv(
        with_limits(command, python, MAX_PROCESSES, MEMORY_LIMIT_BYTES), cwd=cwd, writable=writable, read_only=read_only, gpu=gpu
    )
    return Plan(sandbox, argv, env, scratch, install, install_env, user, index_socket, index)


def run_install(plan: Plan) -> tuple[int, str | None]:
    """The install step of a sandboxed ``--pip`` run: its exit status (0, or as the suite's: 3 pip could not install
    the release, 2 otherwise) and the last line of its standard error (the reason, when it failed)."""
    assert plan.install is not None
    assert plan.index_socket is not None
    last: str | None = None
    with serving(plan.index_socket, plan.index), subprocess.Popen(  # noqa: S603 -- bubblewrap and our interpreter, no shell
        plan.install, cwd=plan.cwd, env=plan.install_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, **plan.popen_options(),
    ) as proc:  # fmt: skip
        assert proc.stderr is not None
        for line in proc.stderr:
            last = line.strip() or last
        code = proc.wait()
    if code == 0:
        return 0, None
    return (code if code == ExitStatus.INSTALL else ExitStatus.USAGE), (last or f"the install step exited with status {code}")
