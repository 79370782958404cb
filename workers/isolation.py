"""How the suite subprocess is isolated from the worker (:class:`Sandbox`, ``SPECWATCH_WORKER_SANDBOX``).

Every commit of a watched repository is code that runs in the suite (:mod:`workers.sandbox`), so the suite is
isolated from the worker:

- ``bwrap`` (bubblewrap, Debian's ``bubblewrap`` package): new user, pid, network, IPC, UTS and cgroup
  namespaces; inside, uid/gid 65534 with no capability; the filesystem is only read-only binds of the system
  (``/usr``, the few ``/etc`` files a Python needs, ``/sys``), the suite's interpreter and the ``specwatch``
  package, plus the run's scratch directory (read-write: the checkout, HOME, the result file). So the code
  under test sees no process of the worker (its own ``/proc``), no file of the service (database, ``.env``,
  mirrors), and has no network but its own loopback. A release (pip mode) is installed first, in a step of
  its own that has the network and the release cache read-write; the test itself then runs without the
  network, the cache read-only. On CUDA the GPU device nodes are bound in (``sandbox_gpu_devices``); the
  driver's libraries come with ``/usr``.
  A root worker starts bubblewrap itself as ``sandbox_uid`` where it can (``drop_uid``), so that the kernel
  counts the sandbox's tasks against its process limit (:mod:`workers.limits`).
- ``uid``: without bubblewrap, a worker running as root starts the suite as ``sandbox_uid``; with the worker
  non-dumpable that uid cannot read the worker's ``/proc/<pid>/environ`` or memory, nor write its files; it
  keeps the network and can read world-readable files.
- ``off``: the suite runs as the worker's user.

``auto`` takes the first that works here. Anything below ``bwrap`` is logged as a warning on every run.
The worker process makes itself non-dumpable (:func:`workers.sandbox.make_non_dumpable`) before it starts a suite.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import specwatch

log = logging.getLogger(__name__)

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
    # bwrap started as :attr:`uid` by a root worker: the kernel does not count root's tasks against
    # RLIMIT_NPROC, so run as root the sandbox would have no process limit (workers.limits).
    drop_uid: bool = False

    @property
    def switches_uid(self) -> bool:
        """Whether the worker itself starts the suite (or bubblewrap) as :attr:`uid`: ``uid`` mode, or ``drop_uid``."""
        return self.mode == "uid" or self.drop_uid

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
        package = Path(specwatch.__file__).resolve().parent
        for folder in (*self.read_only, package, *read_only):
            args += ["--ro-bind", str(folder), str(folder)]
        for folder in writable:
            args += ["--bind", str(folder), str(folder)]
        return [*args, "--chdir", str(cwd), "--", *command]


def _bwrap_works(bwrap: str, python: str, roots: tuple[Path, ...], uid: int, gid: int, *, as_uid: bool = False) -> str | None:
    """None when bubblewrap runs ``python`` here with the sandbox's layout (started as ``uid`` with ``as_uid``),
    else why not (its error)."""
    probe = Sandbox("bwrap", bwrap=bwrap, uid=uid, gid=gid, read_only=roots)
    as_user: dict[str, Any] = {"user": uid, "group": gid, "extra_groups": []} if as_uid else {}
    with tempfile.TemporaryDirectory(prefix="specwatch-sandbox-probe-") as scratch:
        if as_uid:
            os.chown(scratch, uid, gid)
        argv = probe.argv(
            [python, "-c", "import os, sys; sys.exit(0 if os.getuid() == int(sys.argv[1]) else 3)", str(uid)],
            cwd=Path(scratch),
            writable=[Path(scratch)],
        )
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env={"PATH": os.defpath}, **as_user)  # noqa: S603 -- fixed argv
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
                # A root worker starts bubblewrap as the sandbox uid where it can (else its tasks escape RLIMIT_NPROC).
                drop = os.geteuid() == 0 and _bwrap_works(bwrap, python, roots, uid, gid, as_uid=True) is None
                if os.geteuid() == 0 and not drop:
                    log.warning("sandbox_without_process_limit: bubblewrap does not run as uid %s here, so it runs as root", uid)
                return Sandbox("bwrap", bwrap=bwrap, uid=uid, gid=gid, read_only=roots, devices=devices, drop_uid=drop)
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
