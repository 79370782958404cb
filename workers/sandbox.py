"""The suite subprocess: isolated from the worker, a clean environment, a wall-clock limit, a memory limit,
no orphan left behind.

The suite runs as ``python -m workers.suite run ... --json FILE --events`` with the checkout's source
directory first on ``PYTHONPATH`` (for a release: ``--pip NAME==VERSION``), in its own session (so a timeout
kills all it started), with ``RLIMIT_AS`` where the OS allows and, on Linux, ``PR_SET_PDEATHSIG`` so it dies
with its worker. Its environment is built from nothing: no ``SPECWATCH_*`` secret (database URL, webhook
secret, tokens) is handed to the code under test.

Every commit of a watched repository is code that runs here, so the suite is also isolated from the worker
(:class:`Sandbox`, ``SPECWATCH_WORKER_SANDBOX``):

- ``bwrap`` (bubblewrap, Debian's ``bubblewrap`` package): new user, pid, network, IPC, UTS and cgroup
  namespaces; inside, uid/gid 65534 with no capability; the filesystem is only read-only binds of the system
  (``/usr``, the few ``/etc`` files a Python needs, ``/sys``), the suite's interpreter and the ``workers``
  package, plus the run's scratch directory (read-write: the checkout, HOME, the result file). So the code
  under test sees no process of the worker (its own ``/proc``), no file of the service (database, ``.env``,
  mirrors), and has no network but its own loopback. A release (pip mode) is installed first, in a step of
  its own that has the network and the release cache read-write; the test itself then runs without the
  network, the cache read-only. On CUDA the GPU device nodes are bound in (``sandbox_gpu_devices``); the
  driver's libraries come with ``/usr``.
- ``uid``: without bubblewrap, a worker running as root starts the suite as ``sandbox_uid``; with the worker
  non-dumpable that uid cannot read the worker's ``/proc/<pid>/environ`` or memory, nor write its files; it
  keeps the network and can read world-readable files.
- ``off``: the suite runs as the worker's user.

``auto`` takes the first that works here. Anything below ``bwrap`` is logged as a warning on every run.
The worker process makes itself non-dumpable (:func:`make_non_dumpable`) before it starts a suite.
"""

from __future__ import annotations

import ctypes
import glob
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import workers

log = logging.getLogger(__name__)

#: The directory holding the ``workers`` package: the suite's code, after the target's.
SPECWATCH_ROOT = Path(workers.__file__).resolve().parent.parent
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_POLL_S = 0.2


def source_dir(checkout: Path) -> Path:
    """Where a checkout's importable code lives: ``src/`` for src-layout projects (transformers), else the root."""
    src = checkout / "src"
    return src if src.is_dir() else checkout


def suite_environment(python_path: Sequence[Path], home: Path, passthrough: Sequence[str], base: Mapping[str, str]) -> dict[str, str]:
    """The suite's whole environment: PATH, HOME and TMPDIR in the scratch directory, one thread, PYTHONPATH.

    Only the names in ``passthrough`` are copied from ``base`` (never a ``SPECWATCH_*`` one).
    """
    env = {
        "PATH": base.get("PATH", os.defpath),
        "HOME": str(home),
        "TMPDIR": str(home),
        "LANG": base.get("LANG", "C.UTF-8"),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(str(p) for p in python_path),
        "PYTHONUNBUFFERED": "1",
        "PYTHONNOUSERSITE": "1",
    }
    for name in passthrough:
        if name in base and not name.upper().startswith("SPECWATCH_"):
            env[name] = base[name]
    return env


@lru_cache(maxsize=1)
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _child_setup(memory_limit_bytes: int | None, parent_pid: int) -> Callable[[], None]:
    """What the child does between fork and exec: limit its memory, die with its parent."""
    libc = _libc() if sys.platform == "linux" else None  # loaded before the fork, not in the child

    def setup() -> None:
        if memory_limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
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


# What of /etc a Python needs (the dynamic loader, names of users and hosts, TLS roots for a pip install):
# the rest of /etc (shadow, the host's own configuration) is not bound.
_ETC = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "resolv.conf",
    "host.conf",
    "gai.conf",
    "localtime",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "alternatives",
    "mime.types",
    "pip.conf",
)
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True)
class Sandbox:
    """How the suite is isolated from the worker (see the module docstring); build it with :func:`resolve_sandbox`.

    ``mode`` is ``bwrap``, ``uid`` or ``off``; ``reason`` says why it is not ``bwrap`` (empty when it is).
    """

    mode: str
    bwrap: str | None = None
    uid: int = 65534
    gid: int = 65534
    read_only: tuple[Path, ...] = ()  # the interpreter's prefixes: bound read-only at the same paths
    devices: tuple[str, ...] = ()  # device-node globs bound on CUDA runs
    reason: str = ""

    @property
    def switches_uid(self) -> bool:
        """Whether the suite is started as :attr:`uid` by the worker itself (``uid`` mode)."""
        return self.mode == "uid"

    def argv(
        self,
        command: Sequence[str],
        *,
        cwd: Path,
        writable: Sequence[Path],
        read_only: Sequence[Path] = (),
        network: bool = False,
        gpu: bool = False,
    ) -> list[str]:
        """``command`` wrapped for this sandbox: for ``bwrap``, the bubblewrap command line; else unchanged."""
        if self.mode != "bwrap" or self.bwrap is None:
            return list(command)
        args = [self.bwrap, "--unshare-all", *(("--share-net",) if network else ()), "--die-with-parent", "--new-session"]
        args += ["--uid", str(self.uid), "--gid", str(self.gid), "--cap-drop", "ALL", "--hostname", "specwatch-suite"]
        for path in _SYSTEM:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for name in _ETC:
            if os.path.lexists(f"/etc/{name}"):
                args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        args += ["--ro-bind-try", "/sys", "/sys", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # noqa: S108 -- a private tmpfs inside the sandbox
        if gpu:
            for pattern in self.devices:
                for node in sorted(glob.glob(pattern)):
                    args += ["--dev-bind", node, node]
        package = Path(workers.__file__).resolve().parent
        for folder in (*self.read_only, package, *read_only):
            args += ["--ro-bind", str(folder), str(folder)]
        for folder in writable:
            args += ["--bind", str(folder), str(folder)]
        return [*args, "--chdir", str(cwd), "--", *command]


def _bwrap_works(bwrap: str, python: str, roots: tuple[Path, ...], uid: int, gid: int) -> str | None:
    """None when bubblewrap runs ``python`` here with the sandbox's layout, else why not (its error)."""
    probe = Sandbox("bwrap", bwrap=bwrap, uid=uid, gid=gid, read_only=roots)
    with tempfile.TemporaryDirectory(prefix="specwatch-sandbox-probe-") as scratch:
        argv = probe.argv(
            [python, "-c", "import os, sys; sys.exit(0 if os.getuid() == int(sys.argv[1]) else 3)", str(uid)],
            cwd=Path(scratch),
            writable=[Path(scratch)],
        )
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env={"PATH": os.defpath})  # noqa: S603 -- fixed argv
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bwrap did not run: {exc}"
    if done.returncode != 0:
        return f"bwrap failed (exit {done.returncode}): {(done.stderr.strip().splitlines() or ['no output'])[-1]}"
    return None


def _uid_switch_works(python: str, uid: int, gid: int) -> str | None:
    if os.geteuid() != 0:
        return "the worker is not root, so it cannot start the suite as another user"
    try:
        done = subprocess.run(  # noqa: S603 -- our interpreter, a fixed script
            [python, "-c", "pass"],
            user=uid,
            group=gid,
            extra_groups=[],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={"PATH": os.defpath},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"uid {uid} cannot run {python}: {exc}"
    return None if done.returncode == 0 else f"uid {uid} cannot run {python}: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"


@lru_cache(maxsize=8)
def python_roots(python: str) -> tuple[Path, ...]:
    """The folders an interpreter needs (its prefixes and base prefixes, resolved), outside the system ones."""
    script = "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]))"
    done = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=60, check=True, env={"PATH": os.defpath})  # noqa: S603
    found = {Path(p).resolve() for p in json.loads(done.stdout)} | {Path(python).resolve().parent.parent}
    system = tuple(Path(p).resolve() for p in _SYSTEM if os.path.isdir(p))
    return tuple(sorted(p for p in found if not any(p == s or p.is_relative_to(s) for s in system)))


@lru_cache(maxsize=8)
def resolve_sandbox(mode: str, python: str, uid: int = 65534, gid: int = 65534, devices: tuple[str, ...] = ()) -> Sandbox:
    """The :class:`Sandbox` for ``mode`` (``auto``, ``bwrap``, ``uid``, ``off``) and the suite's interpreter,
    probed once per process. ``bwrap`` or ``uid`` asked for but not possible here raises :class:`RuntimeError`."""
    if mode == "off":
        return Sandbox("off", reason="SPECWATCH_WORKER_SANDBOX=off")
    reasons = []
    if mode in ("auto", "bwrap"):
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            reasons.append("bubblewrap (bwrap) is not installed")
        else:
            roots = python_roots(python)
            problem = _bwrap_works(bwrap, python, roots, uid, gid)
            if problem is None:
                return Sandbox("bwrap", bwrap=bwrap, uid=uid, gid=gid, read_only=roots, devices=devices)
            reasons.append(problem)
        if mode == "bwrap":
            raise RuntimeError(f"SPECWATCH_WORKER_SANDBOX=bwrap but {'; '.join(reasons)}")
    problem = _uid_switch_works(python, uid, gid)
    if problem is None:
        return Sandbox("uid", uid=uid, gid=gid, reason="; ".join(reasons))
    if mode == "uid":
        raise RuntimeError(f"SPECWATCH_WORKER_SANDBOX=uid but {problem}")
    return Sandbox("off", reason="; ".join([*reasons, problem]))


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
    # How the suite is isolated from the worker; None: not at all (the suite's own tests, device probes).
    sandbox: Sandbox | None = field(default=None, compare=False)

    @property
    def cache_dir(self) -> Path | None:
        """Where a pip-mode run's releases are installed (SPECWATCH_CACHE_DIR), if set."""
        value = dict(self.env).get("SPECWATCH_CACHE_DIR")
        return Path(value) if value else None

    def install_argv(self) -> list[str]:
        """The install step of a pip-mode run: the release into its cached folder (before the test, with network)."""
        script = "import sys; from workers.suite.targets.install import pip_install; pip_install(sys.argv[1])"
        return [self.python, "-c", script, self.pip or ""]

    def argv(self, result_path: Path) -> list[str]:
        """The suite's command line, writing its run result to ``result_path``."""
        return [
            self.python,
            "-m",
            "workers.suite",
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
    its own with the network (the same deadline covers both). Files left in ``scratch``: ``result.json`` (the
    run result), ``suite.out`` (JSON-lines events), ``suite.err``. ``spawn_lock`` is held across the fork so
    that no other thread of ours holds a lock then.
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
    # Of SPECWATCH_ROOT only the workers package is bound (Sandbox.argv): not the service's folder, its .env
    # or database.
    checkout_paths = [p for p in command.python_path if not p.is_relative_to(scratch) and p != SPECWATCH_ROOT]
    cache = command.cache_dir
    gpu = command.device.startswith("cuda")
    with (scratch / "suite.out").open("wb") as out, err_path.open("wb") as err:
        step = _Step(env=env, cwd=scratch, out=out, err=err, sandbox=sandbox, memory=command.memory_limit_bytes, spawn_lock=spawn_lock)
        code: int | None = 0
        timed_out = aborted = False
        if command.pip and sandbox.mode != "off" and cache is not None:
            cache.mkdir(parents=True, exist_ok=True)
            (cache / "pip").mkdir(exist_ok=True)
            if sandbox.switches_uid:
                os.chown(cache / "pip", sandbox.uid, sandbox.gid)
            install = sandbox.argv(command.install_argv(), cwd=scratch, writable=[scratch, cache], read_only=checkout_paths, network=True)
            code, timed_out, aborted = step.run(install, deadline, should_abort)
        if code == 0 and not (timed_out or aborted):
            read_only = [*checkout_paths, *((cache,) if cache is not None and cache.exists() else ())]
            argv = sandbox.argv(command.argv(result_path), cwd=scratch, writable=[scratch], read_only=read_only, gpu=gpu)
            code, timed_out, aborted = step.run(argv, deadline, should_abort)
        elif code is not None and code > 0:
            code = 2  # the release could not be installed: the suite could not test it
    killed = timed_out or aborted
    return SuiteOutcome(
        exit_code=None if killed else code,
        timed_out=timed_out,
        aborted=aborted,
        result=None if killed else _read_result(result_path),
        stderr_tail=_tail(err_path, tail_chars),
        duration_s=time.monotonic() - started,
    )


@dataclass(frozen=True)
class _Step:
    """One subprocess of a run (install or test), supervised until it exits, the deadline or an abort."""

    env: dict[str, str]
    cwd: Path
    out: Any
    err: Any
    sandbox: Sandbox
    memory: int | None
    spawn_lock: threading.Lock | None

    def run(self, argv: list[str], deadline: float, should_abort: Callable[[], bool]) -> tuple[int | None, bool, bool]:
        """(exit status, timed out, aborted) of ``argv``; the status is None when we killed it."""
        guard: AbstractContextManager[Any] = self.spawn_lock if self.spawn_lock is not None else nullcontext()
        as_user: dict[str, Any] = (
            {"user": self.sandbox.uid, "group": self.sandbox.gid, "extra_groups": []} if self.sandbox.switches_uid else {}
        )
        with guard:
            proc = subprocess.Popen(  # noqa: S603 -- our interpreter and arguments, no shell
                argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=self.out,
                stderr=self.err,
                start_new_session=True,
                preexec_fn=_child_setup(self.memory, os.getpid()),  # noqa: PLW1509 -- fork happens under spawn_lock
                **as_user,
            )
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
                    else:
                        continue
                    _kill_group(proc)
                    break
        finally:
            if proc.poll() is None:  # interrupted (soft time limit, shutdown): leave nothing running
                _kill_group(proc)
        return (None if timed_out or aborted else proc.returncode), timed_out, aborted


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
