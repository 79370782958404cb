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


def cache_root() -> Path:
    return Path(os.environ.get("SPECWATCH_CACHE_DIR") or Path.home() / ".cache" / "specwatch") / "pip"


def pip_install(requirement: str, *, log: bool = True) -> Path:
    """Install ``requirement`` (e.g. ``transformers==4.46.3``) and its dependencies into a cached folder.

    The folder is reused once complete; torch, numpy and scipy stay the interpreter's own
    (a constraints file pins them to the installed versions, and they are removed from the folder).
    """
    if not re.fullmatch(r"[A-Za-z0-9_.\-\[\],]+(==|>=|<=|~=)[A-Za-z0-9_.\-+]+", requirement):
        raise TargetError(f"--pip expects NAME==VERSION (or another single specifier), got {requirement!r}")
    target = cache_root() / re.sub(r"[^A-Za-z0-9_.\-]", "_", requirement)
    done = target / ".specwatch-complete"
    if done.exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    constraints = target / ".constraints.txt"
    constraints.write_text("".join(f"{name}=={_installed_version(name)}\n" for name in _SHARED if _installed_version(name)))
    if log:
        print(f"installing {requirement} into {target}", file=sys.stderr, flush=True)  # noqa: T201 - progress on stderr
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
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        raise TargetError(f"pip could not install {requirement}: {tail}")
    for name in _SHARED:  # keep the interpreter's builds
        for path in target.glob(f"{name}*"):
            if path.is_dir() and (path.name == name or path.name.startswith(f"{name}-")):
                _remove_tree(path)
    done.write_text(requirement + "\n")
    return target


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
