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

import json
import logging
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import specwatch
from specwatch.index_proxy import forwarded, index_hosts, serving
from specwatch.protocol import ExitStatus
from specwatch.sandbox import ENVIRONMENT_COMPLETE, Sandbox, environment_folder, release_entries, suite_environment, with_limits
from workers.limits import RunLimits
from workers.supervise import Step, make_non_dumpable

#: The directory holding the ``specwatch`` package (the suite, and the public API a sampler under test imports),
#: on the suite's PYTHONPATH after the target's code: a checkout's root, or the site-packages of an install.
SPECWATCH_ROOT = Path(specwatch.__file__).resolve().parent.parent

log = logging.getLogger(__name__)


def source_dir(checkout: Path) -> Path:
    """Where a checkout's importable code lives: ``src/`` for src-layout projects (transformers), else the root."""
    src = checkout / "src"
    return src if src.is_dir() else checkout


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
    limits = command.limits
    # RLIMIT_NPROC where the kernel counts only the sandbox's tasks: inside bubblewrap's user namespace, or on
    # the suite run as the sandbox uid (never on the worker's own uid: it would count the worker's processes).
    nproc = limits.max_processes if sandbox.mode in ("bwrap", "uid") else None

    with (scratch / "suite.out").open("wb") as out, err_path.open("wb") as err:
        step = Step(
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
        steps = _Steps(command, sandbox, step, scratch, home, checkout_paths, nproc, deadline, should_abort)
        code, timed_out, aborted = steps.install()
        if code == 0 and not (timed_out or aborted):
            code, timed_out, aborted = steps.test(result_path)
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


@dataclass
class _Steps:
    """The steps of one run in its sandbox: the install steps (a release, a checkout's declared dependencies), then
    the suite. Each writes only what it must: an install step its own cache entries, the suite its scratch."""

    command: SuiteCommand
    sandbox: Sandbox
    step: Step
    scratch: Path
    home: Path
    checkout_paths: list[Path]
    nproc: int | None
    deadline: float
    should_abort: Callable[[], bool]

    def confined(self, argv: list[str]) -> list[str]:
        return with_limits(argv, self.command.python, self.nproc) if self.sandbox.mode == "bwrap" else argv

    def installing(self, argv: list[str], entries: list[Path]) -> tuple[int | None, bool, bool]:
        """An install step: in bubblewrap the package index only (through the proxy, specwatch.index_proxy) and
        only ``entries`` of the cache writable (the other entries read-only); else as it is. On a CUDA run it sees
        the GPU as the test does: a build for this machine (llama.cpp's GGML_CUDA) looks for it."""
        cache = self.command.cache_dir
        assert cache is not None
        for entry in entries:
            entry.mkdir(parents=True, exist_ok=True)
            if self.sandbox.switches_uid:
                os.chown(entry, self.sandbox.uid, self.sandbox.gid)
        if self.sandbox.mode != "bwrap":
            return self.step.run(argv, self.deadline, self.should_abort)
        index = self.scratch / "index.sock"
        confined_argv = self.confined(forwarded(argv, self.command.python, index))
        writable, read_only = [self.scratch, *entries], [*self.checkout_paths, cache]
        gpu = self.command.device.startswith("cuda")
        wrapped = self.sandbox.argv(confined_argv, cwd=self.scratch, writable=writable, read_only=read_only, gpu=gpu)
        with serving(index, index_hosts(self.step.env, self.command.python)):
            return self.step.run(wrapped, self.deadline, self.should_abort)

    def install(self) -> tuple[int | None, bool, bool]:
        """The release (only its cache entry writable), then the checkout's declared dependencies, where asked."""
        command, cache = self.command, self.command.cache_dir
        code: int | None = 0
        timed_out = aborted = False
        if command.pip and self.sandbox.mode != "off" and cache is not None:
            code, timed_out, aborted = self.installing(command.install_argv(), release_entries(cache, command.pip))
        if command.dependencies_of is not None and cache is not None:
            checkout = command.dependencies_of
            code, timed_out, aborted, environment = _dependencies(command, checkout, cache, self.scratch, self.installing)
            if environment is not None:  # after the checkout's code, before the suite's interpreter's packages
                source, *rest = command.python_path
                self.step.env = suite_environment((source, environment, *rest), self.home, command.passthrough, os.environ) | dict(
                    command.env
                )
        return code, timed_out, aborted

    def test(self, result_path: Path) -> tuple[int | None, bool, bool]:
        """The suite, writing only its scratch; the checkouts and the cache read-only."""
        cache = self.command.cache_dir
        read_only = [*self.checkout_paths, *((cache,) if cache is not None and cache.exists() else ())]
        gpu = self.command.device.startswith("cuda")
        argv = self.sandbox.argv(
            self.confined(self.command.argv(result_path)), cwd=self.scratch, writable=[self.scratch], read_only=read_only, gpu=gpu
        )
        return self.step.run(argv, self.deadline, self.should_abort)


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
