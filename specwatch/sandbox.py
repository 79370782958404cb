"""The sandbox the code under test runs in: the worker's suite runs and ``specwatch check`` build it here.

Every commit of a watched repository, every release and every sampler a user names is code that runs in the suite,
so the suite runs isolated (:class:`Sandbox`, built by :func:`resolve_sandbox`):

- ``bwrap`` (bubblewrap, Debian's ``bubblewrap`` package): new user, pid, network, IPC, UTS and cgroup
  namespaces; inside, uid/gid 65534 with no capability; the filesystem is only read-only binds of the system
  (``/usr``, the few ``/etc`` files a Python needs, ``/sys``), the suite's interpreter and the ``specwatch``
  package, the code under test (read-only), plus a scratch directory (read-write: HOME, the result file). So the
  code under test sees no other process (its own ``/proc``), no file of the host beyond those (no ``/etc/shadow``,
  no ``~/.ssh``, no database, no ``.env``), and has no network but its own loopback. A release (``--pip``) is
  installed first, in a step of its own that reaches the package index and writes only that release's cache entry
 ; the test itself then runs without the network, the cache read-only. On CUDA the
  GPU device nodes are bound in (:data:`GPU_DEVICES`); the driver's libraries come with ``/usr``.
  A root worker starts bubblewrap itself as ``uid`` where it can (``drop_uid``), so that the kernel counts the
  sandbox's tasks against its process limit (:func:`with_limits`).
- ``uid``: without bubblewrap, a worker running as root starts the suite as ``uid``; that uid cannot read the
  worker's ``/proc/<pid>/environ`` or memory (the worker is non-dumpable), nor write its files; it keeps the
  network and can read world-readable files.
- ``off``: the suite runs as the caller's user.

Its environment is built from nothing (:func:`suite_environment`): no ``SPECWATCH_*`` secret, no database URL.
Inside bubblewrap :data:`LAUNCHER` sets ``RLIMIT_NPROC`` (counted per user namespace, so only the sandbox's own
tasks) and ``RLIMIT_AS`` before the suite starts.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from specwatch.targets.registry import registry

log = logging.getLogger(__name__)

#: The ``specwatch`` package's folder: bound read-only into every sandbox (the suite, and the API a sampler imports).
PACKAGE = Path(__file__).resolve().parent

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
#: Device nodes bound into the sandbox on CUDA runs (globs); the driver's libraries come with /usr.
GPU_DEVICES = ("/dev/nvidia[0-9]*", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
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
        for folder in (*self.read_only, PACKAGE, *read_only):
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


def bubblewrap(python: str, uid: int = 65534, gid: int = 65534, devices: tuple[str, ...] = ()) -> Sandbox:
    """The ``bwrap`` :class:`Sandbox` for the interpreter ``python`` where bubblewrap runs it here, else an ``off``
    one whose ``reason`` says why not (not installed, or its error)."""
    found = shutil.which("bwrap")
    if found is None:
        return Sandbox("off", reason="bubblewrap (bwrap) is not installed")
    roots = python_roots(python)
    problem = _bwrap_works(found, python, roots, uid, gid)
    if problem is not None:
        return Sandbox("off", reason=problem)
    # A root caller starts bubblewrap as the sandbox uid where it can (else its tasks escape RLIMIT_NPROC).
    drop = os.geteuid() == 0 and _bwrap_works(found, python, roots, uid, gid, as_uid=True) is None
    return Sandbox("bwrap", bwrap=found, uid=uid, gid=gid, read_only=roots, devices=devices, drop_uid=drop)


@lru_cache(maxsize=8)
def resolve_sandbox(mode: str, python: str, uid: int = 65534, gid: int = 65534, devices: tuple[str, ...] = ()) -> Sandbox:
    """The worker's :class:`Sandbox` for ``mode`` (``auto``, ``bwrap``, ``uid``, ``off``) and the suite's interpreter,
    probed once per process. ``bwrap`` or ``uid`` asked for but not possible here raises :class:`RuntimeError`."""
    if mode == "off":
        return Sandbox("off", reason="SPECWATCH_WORKER_SANDBOX=off")
    reasons = []
    if mode in ("auto", "bwrap"):
        sandbox = bubblewrap(python, uid, gid, devices)
        if sandbox.mode == "bwrap":
            if os.geteuid() == 0 and not sandbox.drop_uid:
                log.warning("sandbox_without_process_limit: bubblewrap does not run as uid %s here, so it runs as root", uid)
            return sandbox
        reasons.append(sandbox.reason)
        if mode == "bwrap":
            raise RuntimeError(f"SPECWATCH_WORKER_SANDBOX=bwrap but {'; '.join(reasons)}")
    problem = _uid_switch_works(python, uid, gid)
    if problem is None:
        return Sandbox("uid", uid=uid, gid=gid, reason="; ".join(reasons))
    if mode == "uid":
        raise RuntimeError(f"SPECWATCH_WORKER_SANDBOX=uid but {problem}")
    return Sandbox("off", reason="; ".join([*reasons, problem]))


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


#: Run inside the sandbox in front of a command: ``RLIMIT_NPROC`` (of its user namespace) and ``RLIMIT_AS``, each
#: when above 0, then the command. argv: the two limits, then the command (an absolute path or found on PATH).
LAUNCHER = (
    "import os, resource, sys; n, m = int(sys.argv[1]), int(sys.argv[2]); "
    "n > 0 and resource.setrlimit(resource.RLIMIT_NPROC, (n, n)); m > 0 and resource.setrlimit(resource.RLIMIT_AS, (m, m)); "
    "os.execvp(sys.argv[3], sys.argv[3:])"
)


def with_limits(command: list[str], python: str, max_processes: int | None, memory_bytes: int | None = None) -> list[str]:
    """``command`` started by :data:`LAUNCHER` under ``python`` with ``RLIMIT_NPROC`` ``max_processes`` and
    ``RLIMIT_AS`` ``memory_bytes`` (None: not set; both None: the command as is)."""
    if max_processes is None and memory_bytes is None:
        return command
    return [python, "-c", LAUNCHER, str(max_processes or 0), str(memory_bytes or 0), *command]


def release_folder_name(requirement: str, *, kernels_only: bool = False) -> str:
    """The release cache entry of ``requirement`` (a folder of ``SPECWATCH_CACHE_DIR/pip``)."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", requirement) + (".kernels-only" if kernels_only else "")


def may_be_kernels_only(requirement: str) -> bool:
    """Whether ``requirement`` names (exactly, ``NAME==X.Y...``) a release of a distribution that its target installs
    kernels-only where torch sees no CUDA device, from that distribution's ``kernels_only_since`` on
    (:class:`specwatch.targets.registry.Distribution`: ``vllm`` from 0.34, ``sglang`` from 0.5)."""
    found = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9_.\-]*)==(\d+)\.(\d+)(?:\.[0-9A-Za-z.+\-]*)?", requirement)
    if found is None:
        return False
    described = registry().distribution(found[1])
    since = described[1].kernels_only_since if described is not None and described[1].name == found[1] else None
    return since is not None and (int(found[2]), int(found[3])) >= since


def built_release(requirement: str) -> tuple[str, str] | None:
    """``(top folder, version)`` of ``requirement`` where it names an exact release of a distribution whose target
    builds its releases into a cache folder of their own (:attr:`specwatch.targets.registry.Distribution.built`:
    llama-cpp-python's ``llamacpp/<version>``, the vendored llama.cpp compiled once per version; any spelling of its
    name), else None."""
    found = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)==([0-9][A-Za-z0-9_.+\-]*)\s*", requirement)
    if found is None:
        return None
    described = registry().distribution(found[1])
    top = described[1].built if described is not None else None
    return None if top is None else (top, found[2])


def release_entries(cache: Path, requirement: str) -> list[Path]:
    """The release cache entries an install of ``requirement`` may write under ``cache`` (``SPECWATCH_CACHE_DIR``):
    its folder, and its kernels-only folder where it may be one; for a built library (:func:`built_release`), its
    build folder. During that install they are the only writable part of the cache: the entries of other
    releases are bound read-only."""
    built = built_release(requirement)
    if built is not None:
        top, version = built
        return [cache / top / version]
    names = [release_folder_name(requirement)]
    if may_be_kernels_only(requirement):
        names.append(release_folder_name(requirement, kernels_only=True))
    return [cache / "pip" / name for name in names]


#: Files whose presence says a source checkout declares a Python project, whose requirements the worker resolves and
#: installs before testing it (:mod:`specwatch.targets.dependencies`).
PROJECT_FILES = ("pyproject.toml", "setup.py", "setup.cfg")


def declares_project(checkout: Path) -> bool:
    """Whether ``checkout`` declares a Python project (one of :data:`PROJECT_FILES` at its top)."""
    return any((checkout / name).is_file() for name in PROJECT_FILES)


#: The marker of a complete dependency environment (its folder holds the set it was installed from).
ENVIRONMENT_COMPLETE = ".specwatch-complete"


def environment_folder(cache: Path, key: str) -> Path:
    """Where the dependency set of ``key`` is installed under the release cache ``cache``: the one cache entry its
    install step may write. ``key`` is the 16 hex digits :func:`specwatch.targets.dependencies.environment_key` makes."""
    if not re.fullmatch(r"[0-9a-f]{16}", key):
        raise ValueError(f"not a dependency set's key: {key!r}")
    return cache / "envs" / key


#: Files every llama.cpp checkout has at its top (``--source`` a llama.cpp checkout: its build goes in the cache).
LLAMACPP_CHECKOUT_MARKERS = ("CMakeLists.txt", "include/llama.h")


def source_tree_entry(cache: Path, checkout: Path) -> Path | None:
    """The cache entry of a llama.cpp checkout's build keyed by its tree, ``<cache>/llamacpp/tree/<tree sha>``, when
    the checkout is exactly a commit's tree (no tracked file changed, no untracked file git does not ignore); None
    for anything else (not a llama.cpp checkout, not git, changed). The sandbox's build step of that tree is the only
    one that may write it, and every later run of the same tree reuses the build (another commit has an entry of its
    own, so no build of one tree can leave anything in another's)."""
    if not all((checkout / marker).is_file() for marker in LLAMACPP_CHECKOUT_MARKERS):
        return None
    git = ["git", "-c", f"safe.directory={checkout}", "-C", str(checkout)]
    try:
        tree = subprocess.run([*git, "rev-parse", "HEAD^{tree}"], capture_output=True, text=True, timeout=60, check=False)  # noqa: S603
        status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True, timeout=300, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired):
        return None
    sha = tree.stdout.strip()
    if tree.returncode != 0 or status.returncode != 0 or status.stdout.strip() or not re.fullmatch(r"[0-9a-f]{40,64}", sha):
        return None
    return cache / "llamacpp" / "tree" / sha
