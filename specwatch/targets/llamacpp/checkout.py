"""``--source`` a llama.cpp checkout: its tools built with CMake into the suite's cache, without llama-cpp-python.

A checkout is recognised by its ``CMakeLists.txt`` and ``include/llama.h``. Its build folder is one per checkout
path under ``<cache>/llamacpp/source/``, reused from run to run: CMake rebuilds what changed since the last run
(another commit checked out, edits), so the build identity is rewritten on every run with the commit checked out
now (``git rev-parse HEAD``; ``dirty`` when tracked files differ from it) and the seconds that run's build took
(the whole compile the first time, a few seconds when nothing changed).

In the sandbox (``specwatch check --source``) the build is a step of its own that may write only the entry of the
checkout's tree (:func:`specwatch.sandbox.source_tree_entry`, ``<cache>/llamacpp/tree/<tree sha>/<options>``); a
later run of the same tree, sandboxed or not, reuses that build without compiling. A checkout with changes has no
tree entry: sandboxed, it is built in the run's scratch folder every time. The identity's folder, put first on
``PYTHONPATH`` as a release's package folder is, holds no ``llama_cpp``: the cases of llama-cpp-python's paths say
so and are skipped; the tools' cases run.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from specwatch.sandbox import LLAMACPP_CHECKOUT_MARKERS, source_tree_entry
from specwatch.targets import TargetError
from specwatch.targets.install_errors import InstallError
from specwatch.targets.llamacpp import CACHE_FOLDER, SOURCE_DISTRIBUTION
from specwatch.targets.llamacpp.build import BUILD_INFO, TOOLS, cmake_build, cmake_options

#: Files every llama.cpp checkout has at its top.
MARKERS = LLAMACPP_CHECKOUT_MARKERS


def is_llamacpp_checkout(path: Path) -> bool:
    return all((path / marker).is_file() for marker in MARKERS)


def checkout_root(checkout: Path, cache: Path) -> Path:
    """The checkout's build folder in the cache (one per resolved path)."""
    key = hashlib.sha256(str(checkout.resolve()).encode()).hexdigest()[:16]
    return cache / CACHE_FOLDER / "source" / key


def tree_build(checkout: Path, cache: Path) -> Path | None:
    """The folder of the checkout's tree build with this machine's CMake options (its identity's), or None where
    the checkout has no tree entry (:func:`specwatch.sandbox.source_tree_entry`)."""
    entry = source_tree_entry(cache, checkout)
    if entry is None:
        return None
    return entry / hashlib.sha256(" ".join(cmake_options()).encode()).hexdigest()[:12]


def build_checkout(checkout: Path, cache: Path, *, tools: tuple[str, ...] = TOOLS, log: bool = True, tree: bool = False) -> Path:
    """Build the checkout's library and ``tools`` and return the folder holding its build identity: a build of its
    tree as it is (:func:`tree_build`) reused, else into that tree build with ``tree`` (the sandbox's build step;
    :class:`~specwatch.targets.TargetError` when the checkout has changes), else into the checkout path's folder
    (incrementally where built before). :class:`~specwatch.targets.TargetError` when it does not build."""
    checkout = checkout.resolve()
    if not is_llamacpp_checkout(checkout):
        raise TargetError(f"--source {checkout}: not a llama.cpp checkout (no {' or '.join(MARKERS)})")
    kept = tree_build(checkout, cache)
    if kept is not None and (kept / "python" / BUILD_INFO).is_file():
        if log:
            print(f"reusing the build of the llama.cpp checkout's tree in {kept}", file=sys.stderr, flush=True)  # noqa: T201
        return kept / "python"
    if tree and kept is None:
        raise TargetError(f"--source {checkout}: a build kept by its tree needs a git checkout without changes")
    root = kept if tree and kept is not None else checkout_root(checkout, cache)
    python = root / "python"
    python.mkdir(parents=True, exist_ok=True)
    commit, dirty = git_commit(checkout)
    if log:
        print(f"building the llama.cpp checkout {checkout} ({commit or 'not a git checkout'}) into {root}", file=sys.stderr, flush=True)  # noqa: T201
    started = time.monotonic()
    try:
        options, built = cmake_build(checkout, root / "build", root / "build.log", f"--source {checkout}", tools)
    except InstallError as exc:
        raise TargetError(str(exc)) from exc
    info = {
        "distribution": SOURCE_DISTRIBUTION,
        "version": git_describe(checkout) or commit or "unknown",
        "source": str(checkout),
        "llama_cpp_commit": commit,
        "dirty": dirty,
        "lib": str(root / "build" / "bin"),
        "tools": built,
        "cmake_options": options,
        "build_seconds": round(time.monotonic() - started, 1),
        "build_log": str(root / "build.log"),
    }
    (python / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return python


def _git(checkout: Path, *args: str) -> str | None:
    """``git ARGS`` in the checkout (trusted whoever owns it: a sandbox runs as another user), or None."""
    cmd = ["git", "-c", f"safe.directory={checkout}", "-C", str(checkout), *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit(checkout: Path) -> tuple[str | None, bool]:
    """The commit checked out (None outside git) and whether tracked files differ from it."""
    commit = _git(checkout, "rev-parse", "HEAD")
    status = _git(checkout, "status", "--porcelain", "--untracked-files=no") if commit else None
    return commit, bool(status)


def git_describe(checkout: Path) -> str | None:
    """The checkout's nearest tag and distance (llama.cpp tags its builds ``bNNNN``), or None without tags."""
    return _git(checkout, "describe", "--tags", "--dirty")
