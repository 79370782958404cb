"""A llama-cpp-python release built once per version into the suite's cache: its library and the llama.cpp tools.

``--pip llama-cpp-python==X`` (and ``python -m specwatch.targets.install``) land here from
:func:`specwatch.targets.install.pip_install` (the distribution's ``build``, :mod:`specwatch.targets.llamacpp`). The
release is a source distribution that vendors the llama.cpp tree; it is downloaded once and the vendored tree is
compiled once with CMake (a CPU build here: the machine's own instruction set; ``GGML_CUDA`` where the worker has
CUDA) into shared libraries (``libllama``, ``libggml*``) and the tools the end-to-end cases drive (:data:`TOOLS`).
The Python package is then installed from the same source distribution with its own library build switched off
(``-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF``): it loads the libraries built here (``LLAMA_CPP_LIB_PATH``), so llama.cpp
is compiled once, not twice, for the package and the tools. The build's identity (:data:`BUILD_INFO` in the package
folder) records the llama.cpp commit the release vendors (from its changelog), the CMake options, the build time and
the build log's path.

Layout: ``<cache>/llamacpp/X/`` holds the distribution and its extracted tree, ``build/`` (CMake's,
libraries and tools in ``build/bin``), ``build.log`` and ``python/`` (the folder put first on ``PYTHONPATH``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from specwatch.targets import TargetError
from specwatch.targets.install_errors import InstallError, install_failure
from specwatch.targets.llamacpp import CACHE_FOLDER, DISTRIBUTION

#: The build's identity, in the package folder: what the adapter reads.
BUILD_INFO = "specwatch-llamacpp-build.json"
#: The llama.cpp tools built beside the library (CMake targets), for the end-to-end cases.
TOOLS = ("llama-speculative", "llama-server")
#: CMake options of the tree: shared libraries for the Python package, no tests, no network (no curl).
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF")
#: Commands the build needs, each by what it is and the commands that provide it (one is enough): the worker image
#: installs them (Dockerfile, worker stage).
BUILD_COMMANDS = {"CMake": ("cmake",), "a C++ compiler": ("c++", "g++", "clang++"), "a build tool": ("ninja", "make")}


def missing_build_commands() -> list[str]:
    """What :data:`BUILD_COMMANDS` this machine lacks, in words (empty: it can build llama.cpp)."""
    return [f"{what} ({' or '.join(names)})" for what, names in BUILD_COMMANDS.items() if not any(shutil.which(n) for n in names)]


def cmake_options() -> list[str]:
    """The CMake options of a build on this machine: :data:`CMAKE_OPTIONS` and CUDA on or off (:func:`cuda_device`)."""
    return [*CMAKE_OPTIONS, f"-DGGML_CUDA={'ON' if cuda_device() else 'OFF'}"]


def is_llamacpp(requirement: str) -> bool:
    """Whether ``requirement`` names llama-cpp-python (any spelling of its name)."""
    name = re.split(r"[=<>~!\[;\s]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower() == DISTRIBUTION


def release_root(version: str, cache: Path) -> Path:
    """The release's folder in the cache: the one entry its sandboxed build may write (:func:`release_entries`)."""
    return cache / CACHE_FOLDER / version


def release_built(requirement: str, cache: Path) -> bool:
    """Whether ``llama-cpp-python==X`` is built in the cache already (CI runs the target's smoke only then)."""
    found = re.fullmatch(r"\s*[A-Za-z0-9_.\-]+==([0-9][A-Za-z0-9_.+\-]*)\s*", requirement)
    return found is not None and (release_root(found[1], cache) / "python" / BUILD_INFO).is_file()


def build_release(requirement: str, cache: Path, *, log: bool = True) -> Path:
    """Build ``llama-cpp-python==X`` (once; resumed where an earlier build stopped) and return its package folder.

    Raises :class:`~specwatch.targets.install_errors.InstallError` when the distribution cannot be downloaded or the
    library does not build (the build log's tail in the message). A tool that does not build is recorded in the
    identity (its cases then say so), not an install failure.
    """
    found = re.fullmatch(r"\s*[A-Za-z0-9_.\-]+==([0-9][A-Za-z0-9_.+\-]*)\s*", requirement)
    if found is None:
        raise TargetError(f"--pip {requirement}: a llama-cpp-python release is named by its exact version (llama-cpp-python==X)")
    version = found[1]
    root = release_root(version, cache)
    python = root / "python"
    if (python / BUILD_INFO).exists():
        return python
    root.mkdir(parents=True, exist_ok=True)
    if log:
        print(f"building {requirement} into {root} (compiles llama.cpp: minutes)", file=sys.stderr, flush=True)  # noqa: T201
    sdist = _download(requirement, root)
    src = _extract(sdist, root)
    started = time.monotonic()
    options, tools = cmake_build(src / "vendor" / "llama.cpp", root / "build", root / "build.log", requirement)
    seconds = time.monotonic() - started
    python.mkdir(exist_ok=True)
    env = {**os.environ, "CMAKE_ARGS": "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"}
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--upgrade",
        "--target",
        str(python),
        str(sdist),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)  # noqa: S603
    if result.returncode != 0:
        raise install_failure(requirement, result.stdout + result.stderr)
    for shared in ("numpy", "numpy.libs"):  # the interpreter's numpy stays in force
        shutil.rmtree(python / shared, ignore_errors=True)
    for dist_info in python.glob("numpy-*.dist-info"):
        shutil.rmtree(dist_info, ignore_errors=True)
    info = {
        "distribution": DISTRIBUTION,
        "version": version,
        "llama_cpp_commit": vendored_commit(src, version),
        "lib": str(root / "build" / "bin"),
        "tools": tools,
        "cmake_options": options,
        "build_seconds": round(seconds, 1),
        "build_log": str(root / "build.log"),
    }
    (python / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return python


def _download(requirement: str, root: Path) -> Path:
    existing = sorted(root.glob("*.tar.gz"))
    if existing:
        return existing[0]
    # The release's source distribution, never a wheel of it; what building its metadata needs (scikit-build-core)
    # may come as wheels: with `--no-binary :all:` pip wanted scikit-build-core's own sdist too, which an index of
    # wheels (a mirror, the compose tier's) does not have.
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps", "--no-binary", DISTRIBUTION]
    result = subprocess.run([*cmd, "-d", str(root), requirement], capture_output=True, text=True, check=False)  # noqa: S603
    found = sorted(root.glob("*.tar.gz"))
    if result.returncode != 0 or not found:
        raise install_failure(requirement, result.stdout + result.stderr)
    return found[0]


def _extract(sdist: Path, dest: Path) -> Path:
    """The distribution's top folder under ``dest`` (extracted once)."""
    top = dest / sdist.name.removesuffix(".tar.gz")
    if not top.is_dir():
        with tarfile.open(sdist) as archive:
            if hasattr(tarfile, "data_filter"):
                archive.extractall(dest, filter="data")
            else:  # Python 3.11 before 3.11.4 (Debian bookworm's 3.11.2) has no filters: the same refusals by hand
                _refuse_outside(archive, dest, sdist.name)
                archive.extractall(dest)  # noqa: S202 - every member checked just above
    if not top.is_dir():
        raise TargetError(f"{sdist.name} has no top folder {top.name}")
    return top


def _refuse_outside(archive: tarfile.TarFile, dest: Path, name: str) -> None:
    """:class:`TargetError` unless every member of ``archive`` is a file, folder or link that stays inside ``dest``
    (what ``filter="data"`` also refuses: absolute or ``..`` paths, links out of ``dest``, devices, fifos)."""
    root = dest.resolve()
    for member in archive.getmembers():
        path = (root / member.name).resolve()
        linked = (path.parent / member.linkname).resolve() if member.issym() else (root / member.linkname).resolve()
        outside = not path.is_relative_to(root) or ((member.issym() or member.islnk()) and not linked.is_relative_to(root))
        if outside or not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise TargetError(f"{name}: refusing to extract {member.name!r} (outside the release's folder, or not a file)")


def cmake_build(
    tree: Path, build: Path, log_path: Path, requirement: str, tools: tuple[str, ...] = TOOLS
) -> tuple[list[str], dict[str, Any]]:
    """Configure and build the library and ``tools``; returns the CMake options and each tool's path, or why it did
    not build. Raises :class:`~specwatch.targets.install_errors.InstallError` (``requirement`` names what was built) when
    a build command is missing or the library does not build."""
    missing = missing_build_commands()
    if missing:
        raise InstallError(requirement, "pip", f"building llama.cpp needs {', '.join(missing)}: not found on PATH", wanted=requirement)
    options = cmake_options()
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    jobs = str(os.cpu_count() or 2)
    with log_path.open("a") as log:
        steps: list[tuple[str, list[str]]] = [("configure", ["cmake", "-S", str(tree), "-B", str(build), *generator, *options])]
        steps.append(("llama", ["cmake", "--build", str(build), "-j", jobs, "--target", "llama"]))
        for name, cmd in steps:
            log.write(f"\n$ {' '.join(cmd)}\n")
            log.flush()
            if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode != 0:  # noqa: S603
                raise InstallError(
                    requirement, "pip", f"the llama.cpp {name} step failed: {_tail(log_path)} (log: {log_path})", wanted=requirement
                )
        built: dict[str, Any] = {}
        for tool in tools:
            cmd = ["cmake", "--build", str(build), "-j", jobs, "--target", tool]
            log.write(f"\n$ {' '.join(cmd)}\n")
            log.flush()
            ok = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode == 0  # noqa: S603
            path = build / "bin" / tool
            built[tool] = {"path": str(path)} if ok and path.exists() else {"error": f"did not build: {_tail(log_path)}"}
    return options, built


def cuda_device() -> bool:
    """Whether the worker has a CUDA device to build for: a compiler alone (``nvcc`` on a machine without a GPU)
    would compile CUDA kernels for every architecture (half an hour on two cores) for a library that then runs on
    the CPU."""
    if not shutil.which("nvcc") or not shutil.which("nvidia-smi"):
        return False
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)  # noqa: S607
    return listed.returncode == 0 and "GPU" in listed.stdout


def _tail(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-400:]


def vendored_commit(src: Path, version: str) -> str | None:
    """The llama.cpp commit the release vendors, as its changelog names it (``update llama.cpp to
    ggml-org/llama.cpp@SHA`` in the release's section), or None."""
    changelog = src / "CHANGELOG.md"
    if not changelog.exists():
        return None
    section = re.search(rf"^## \[{re.escape(version)}\]\s*$(.*?)(?=^## \[|\Z)", changelog.read_text(errors="replace"), re.M | re.S)
    found = re.search(r"llama\.cpp@([0-9a-f]{7,40})", section[1]) if section else None
    return found[1] if found else None


def build_info(paths: list[str] | None = None) -> dict[str, Any] | None:
    """The identity of the build whose package folder is on ``paths`` (default ``sys.path``), or None."""
    for entry in paths if paths is not None else sys.path:
        candidate = Path(entry or ".") / BUILD_INFO
        if candidate.is_file():
            info: dict[str, Any] = json.loads(candidate.read_text())
            return info
    return None


def tool_path(info: dict[str, Any] | None, tool: str) -> Path | None:
    """The built tool's path, or None (not built by the suite, or it did not build)."""
    entry = (info or {}).get("tools", {}).get(tool, {})
    path = entry.get("path") if isinstance(entry, dict) else None
    return Path(path) if path and Path(path).exists() else None


def tool_missing(info: dict[str, Any] | None, tool: str) -> str:
    """Why ``tool`` is not available, in words."""
    if info is None:
        return f"{tool} is built by the suite with the release (--pip llama-cpp-python==X); this llama-cpp-python was installed otherwise"
    entry = info.get("tools", {}).get(tool)
    if isinstance(entry, dict) and entry.get("error"):
        return f"{tool} {entry['error']}"
    return f"{tool} was not built with this release (build log: {info.get('build_log')})"
