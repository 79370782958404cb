"""The suite subprocess: isolated from the worker, a clean environment, a wall-clock limit, a memory limit,
no orphan left behind.

The suite runs as ``python -m specwatch run ... --json FILE --events`` with the checkout's source
directory first on ``PYTHONPATH`` (for a release: ``--pip NAME==VERSION``), in its own session (so a timeout
kills all it started), with ``RLIMIT_AS`` where the OS allows, limits on the run's processes and memory in all
(:mod:`workers.limits`) and, on Linux, ``PR_SET_PDEATHSIG`` so it dies
with its worker. Its environment is built from nothing: no ``SPECWATCH_*`` secret (database URL, webhook
secret, tokens) is handed to the code under test.

How it is isolated from the worker (bubblewrap, another uid, or not at all) is :mod:`specwatch.sandbox` (``specwatch
check`` runs the suite in the same sandbox).
The worker process makes itself non-dumpable (:func:`make_non_dumpable`) before it starts a suite.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import specwatch
from specwatch.index_proxy import forwarded, index_hosts, serving
from specwatch.protocol import ExitStatus
from specwatch.sandbox import ENVIRONMENT_COMPLETE, Sandbox, environment_folder, release_entries, suite_environment, with_limits
from workers.cgroups import RunCgroup, make_run_cgroup
from workers.limits import RunLimits, over_limit

#: The directory holding the ``specwatch`` package (the suite, and the public API a sampler under test imports),
#: on the suite's PYTHONPATH after the target's code: a checkout's root, or the site-packages of an install.
SPECWATCH_ROOT = Path(specwatch.__file__).resolve().parent.parent
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_POLL_S = 0.2

log = logging.getLogger(__name__)


def source_dir(checkout: Path) -> Path:
    """Where a checkout's importable code lives: ``src/`` for src-layout projects (transformers), else the root."""
    src = checkout / "src"
    return src if src.is_dir() else checkout


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


def warn_if_not_isolated(sandbox: Sandbox) -> None:
    """The loud warning of a run whose code under test is not fully isolated from the worker."""
    if sandbox.mode == "bwrap":
        return
    what = (
        "runs as another uid but shares the worker's network and can read its world-readable files"
        if sandbox.mode == "uid"
        else "runs AS THE WORKER'S USER, with its network and files"
    )
    log.warning(
        "SUITE NOT ISOLATED: the code under test %s (%s). Install bubblewrap (apt-get install bubblewrap) to isolate it.",
        what,
        sandbox.reason,
    )


def make_non_dumpable() -> None:
    """``prctl(PR_SET_DUMPABLE, 0)`` on this process (Linux): its ``/proc/<pid>/environ``, ``mem`` and ``maps``
    become root's, and no process of its own uid may ptrace it. Idempotent; kept across fork, reset by exec
    (the suite's own process is dumpable again, which exposes only its own clean environment)."""
    if sys.platform == "linux":
        _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


@dataclass(frozen=True)
class SuiteCommand:
    python: str
    target: str
    suite_args: tuple[str, ...]
    seed: int
    device: str
    python_path: tuple[Path, ...]
    timeout_s: float
    memory_limit_bytes: int | None
    passthrough: tuple[str, ...] = ()
    # A release to test instead of the code on python_path: ``--pip NAME==VERSION`` (the suite installs it
    # into its cached folder and puts it first on PYTHONPATH).
    pip: str | None = None
    # Variables set for the suite besides its clean environment: the suite's own knobs (SPECWATCH_CACHE_DIR
    # of pip-mode runs), never a service secret.
    env: tuple[tuple[str, str], ...] = ()
    # A source checkout whose declared dependencies are resolved and installed (once per resolved set, in the
    # cache: specwatch.targets.dependencies) before the test; the environment goes on PYTHONPATH after the
    # checkout's code. None: the suite's interpreter's own packages.
    dependencies_of: Path | None = None
    # How the suite is isolated from the worker; None: not at all (the suite's own tests, device probes).
    sandbox: Sandbox | None = field(default=None, compare=False)
    # The run's limits in all: processes and threads, memory of all its processes (workers.limits).
    limits: RunLimits = field(default_factory=RunLimits)

    @property
    def cache_dir(self) -> Path | None:
        """Where a pip-mode run's releases are installed (SPECWATCH_CACHE_DIR), if set."""
        value = dict(self.env).get("SPECWATCH_CACHE_DIR")
        return Path(value) if value else None

    def install_argv(self) -> list[str]:
        """The install step of a pip-mode run: the release into its cached folder (before the test, with network).
        It exits 0, :attr:`~specwatch.protocol.ExitStatus.INSTALL` when pip cannot install the release, else 2."""
        return [self.python, "-m", "specwatch.targets.install", self.pip or ""]

    def argv(self, result_path: Path) -> list[str]:
        """The suite's command line, writing its run result to ``result_path``."""
        return [
            self.python,
            "-m",
            "specwatch",
            "run",
            "--target",
            self.target,
            *(("--pip", self.pip) if self.pip else ()),
            *self.suite_args,
            "--seed",
            str(self.seed),
            "--device",
            self.device,
            "--json",
            str(result_path),
            "--events",
        ]


@dataclass(frozen=True)
class SuiteOutcome:
    exit_code: int | None  # None: killed by us (timeout or lost lease)
    timed_out: bool
    aborted: bool
    result: dict[str, Any] | None  # the run result JSON, when the suite wrote a valid one
    stderr_tail: str
    duration_s: float
    # Which of the run's limits (workers.limits) it reached, in words, when that ended it (exit_code is None).
    limit: str | None = None


def _tail(path: Path, chars: int) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 4 * chars))
        text = f.read().decode("utf-8", errors="replace")
    return text[-chars:]


def _read_result(path: Path) -> dict[str, Any] | None:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) and isinstance(payload.get("results"), list) else None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_suite_process(
    command: SuiteCommand,
    scratch: Path,
    *,
    should_abort: Callable[[], bool] = lambda: False,
    spawn_lock: threading.Lock | None = None,
    tail_chars: int = 8000,
) -> SuiteOutcome:
    """Run the suite in ``scratch`` (its cwd and HOME) until it exits, the deadline passes or ``should_abort``.

    Isolated as ``command.sandbox`` says; a pip-mode run in a sandbox installs its release first, in a step of
    its own that reaches only the package index and writes only that release's cache entry (the same deadline covers both). Files
    left in ``scratch``: ``result.json`` (the run result), ``suite.out`` (JSON-lines events), ``suite.err``.
    ``spawn_lock`` is held across the fork so that no other thread of ours holds a lock then.
    """
    make_non_dumpable()
    sandbox = command.sandbox or Sandbox("off", reason="no sandbox configured")
    if command.sandbox is not None:
        warn_if_not_isolated(sandbox)
    home = scratch / "home"
    home.mkdir(parents=True, exist_ok=True)
    if sandbox.switches_uid:
        for path in (scratch, home):
            os.chown(path, sandbox.uid, sandbox.gid)
    result_path = scratch / "result.json"
    err_path = scratch / "suite.err"
    env = suite_environment(command.python_path, home, command.passthrough, os.environ) | dict(command.env)
    started = time.monotonic()
    deadline = started + command.timeout_s
    # Of SPECWATCH_ROOT only the specwatch package is bound (Sandbox.argv): not the service's folder, its .env
    # or database.
    checkout_paths = [p for p in command.python_path if not p.is_relative_to(scratch) and p != SPECWATCH_ROOT]
    cache = command.cache_dir
    gpu = command.device.startswith("cuda")
    limits = command.limits
    # RLIMIT_NPROC where the kernel counts only the sandbox's tasks: inside bubblewrap's user namespace, or on
    # the suite run as the sandbox uid (never on the worker's own uid: it would count the worker's processes).
    nproc = limits.max_processes if sandbox.mode in ("bwrap", "uid") else None

    def confined(argv: list[str]) -> list[str]:
        return with_limits(argv, command.python, nproc) if sandbox.mode == "bwrap" else argv

    with (scratch / "suite.out").open("wb") as out, err_path.open("wb") as err:
        step = _Step(
            env=env,
            cwd=scratch,
            out=out,
            err=err,
            sandbox=sandbox,
            memory=command.memory_limit_bytes,
            spawn_lock=spawn_lock,
            limits=limits,
            nproc=nproc if sandbox.mode == "uid" else None,
        )
        code: int | None = 0
        timed_out = aborted = False

        def installing(argv: list[str], entries: list[Path]) -> tuple[int | None, bool, bool]:
            """An install step: in bubblewrap the package index only (through the proxy, specwatch.index_proxy) and
            only ``entries`` of the cache writable (the other entries read-only); else as it is. On a CUDA run it sees
            the GPU as the test does: a build for this machine (llama.cpp's GGML_CUDA) looks for it."""
            assert cache is not None
            for entry in entries:
                entry.mkdir(parents=True, exist_ok=True)
                if sandbox.switches_uid:
                    os.chown(entry, sandbox.uid, sandbox.gid)
            if sandbox.mode != "bwrap":
                return step.run(argv, deadline, should_abort)
            index = scratch / "index.sock"
            confined_argv = confined(forwarded(argv, command.python, index))
            wrapped = sandbox.argv(confined_argv, cwd=scratch, writable=[scratch, *entries], read_only=[*checkout_paths, cache], gpu=gpu)
            with serving(index, index_hosts(env, command.python)):
                return step.run(wrapped, deadline, should_abort)

        if command.pip and sandbox.mode != "off" and cache is not None:
            # Only this release's cache entry is writable: the entries of other releases are bound read-only.
            code, timed_out, aborted = installing(command.install_argv(), release_entries(cache, command.pip))
        if command.dependencies_of is not None and cache is not None:
            code, timed_out, aborted, environment = _dependencies(command, command.dependencies_of, cache, scratch, installing)
            if environment is not None:  # after the checkout's code, before the suite's interpreter's packages
                source, *rest = command.python_path
                step.env = suite_environment((source, environment, *rest), home, command.passthrough, os.environ) | dict(command.env)
        if code == 0 and not (timed_out or aborted):
            read_only = [*checkout_paths, *((cache,) if cache is not None and cache.exists() else ())]
            argv = sandbox.argv(confined(command.argv(result_path)), cwd=scratch, writable=[scratch], read_only=read_only, gpu=gpu)
            code, timed_out, aborted = step.run(argv, deadline, should_abort)
        elif code is not None and code > 0 and code != ExitStatus.INSTALL:
            code = ExitStatus.USAGE  # the install step itself failed (not pip): the suite could not test the release
    killed = timed_out or aborted or step.limit is not None
    return SuiteOutcome(
        exit_code=None if killed else code,
        timed_out=timed_out,
        aborted=aborted,
        result=None if killed else _read_result(result_path),
        stderr_tail=_tail(err_path, tail_chars),
        duration_s=time.monotonic() - started,
        limit=step.limit,
    )


def _dependencies(
    command: SuiteCommand,
    checkout: Path,
    cache: Path,
    scratch: Path,
    installing: Callable[[list[str], list[Path]], tuple[int | None, bool, bool]],
) -> tuple[int | None, bool, bool, Path | None]:
    """Resolve the checkout's declared dependencies (a step writing only ``scratch``), then install the resolved set
    into its environment in the cache unless it is there (a step writing only that entry); the steps' outcome and the
    environment (None unless both succeeded)."""
    resolved = scratch / "dependencies.json"
    module = [command.python, "-m", "specwatch.targets.dependencies"]
    cache.mkdir(parents=True, exist_ok=True)
    code, timed_out, aborted = installing([*module, "resolve", str(checkout), str(resolved)], [])
    if code != 0 or timed_out or aborted:
        return code, timed_out, aborted, None
    try:
        environment = environment_folder(cache, str(json.loads(resolved.read_text())["key"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("dependencies_unreadable run_scratch=%s error=%s", scratch, exc)
        return ExitStatus.USAGE, False, False, None
    if not (environment / ENVIRONMENT_COMPLETE).is_file():
        code, timed_out, aborted = installing([*module, "install", str(resolved)], [environment])
    return code, timed_out, aborted, environment if code == 0 and not (timed_out or aborted) else None


@dataclass
class _Step:
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


@lru_cache(maxsize=8)
def probe_device(python: str) -> str:
    """``cuda`` when ``python`` (the suite's interpreter) sees a GPU, else ``cpu``; asked once per process."""
    home = Path(tempfile.gettempdir())
    env = suite_environment((SPECWATCH_ROOT,), home, ("CUDA_VISIBLE_DEVICES",), os.environ)
    probe = "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')"
    try:
        done = subprocess.run(  # noqa: S603 -- our interpreter, a fixed script
            [python, "-c", probe], env=env, cwd=home, capture_output=True, text=True, timeout=300, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "cpu"
    return "cuda" if done.returncode == 0 and done.stdout.strip() == "cuda" else "cpu"
