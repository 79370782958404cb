"""A source checkout's own dependencies: resolved from what the commit declares, installed once per resolved set.

Source mode tests a commit's tree (its ``src/`` first on ``PYTHONPATH``); its imports must find the versions of
its dependencies that this commit declares (transformers 4.37 wants tokenizers < 0.19 and huggingface-hub < 1.0,
4.45 tokenizers 0.20), not the worker's own. The worker does it in two steps, each under the sandbox's install rules
(the package index only, through the proxy; one writable place), as ``python -m specwatch.targets.dependencies``:

1. ``resolve CHECKOUT OUT``: pip resolves the checkout's declared requirements (its ``pyproject.toml``,
   ``setup.py`` or ``setup.cfg``; built in a copy, as the checkout is read-only) against the index, with the suite's
   torch, numpy and scipy pinned (:func:`~specwatch.targets.install.shared_pins`), and writes the resolved set
   (``name==version`` each; the checkout's own project, the shared packages and torch's companion builds left out)
   and its key (:func:`environment_key`) to ``OUT``. It writes only the run's scratch folder.
2. ``install OUT``: installs that set as it is (``--no-deps``: nothing is resolved again) into
   ``<cache>/envs/<key>`` (:func:`~specwatch.sandbox.environment_folder`), the step's only writable cache entry. A set installed before
   is reused: commits with the same dependencies share one environment, as asv builds one per set.

A checkout that declares no project (no ``pyproject.toml``, ``setup.py`` or ``setup.cfg``) has nothing to resolve
(:func:`~specwatch.sandbox.declares_project`). Exit statuses as a release's install: 0, :attr:`~specwatch.protocol.ExitStatus.INSTALL`
(pip could not resolve or install the set: the commit is uninstallable, the reason on stderr's last line), 2 else.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from specwatch.protocol import ExitStatus
from specwatch.sandbox import ENVIRONMENT_COMPLETE as COMPLETE
from specwatch.sandbox import environment_folder
from specwatch.targets import TargetError
from specwatch.targets.install import COMPANIONS, SHARED, InstallError, cache_root, install_failure, keep_interpreter_builds, shared_pins
from specwatch.targets.interpreter_wheels import STUB_FOLDER, stub_wheels

#: What of a checkout the copy pip builds from leaves out (large, never part of a project's metadata).
_NOT_COPIED = (".git", ".hg", "node_modules", "__pycache__")


def environment_key(requirements: list[str]) -> str:
    """The key of a resolved set: a digest of its sorted ``name==version`` lines and the interpreter's Python
    version (an environment holds compiled wheels of that version)."""
    lines = [*sorted(requirements), f"python {sys.version_info.major}.{sys.version_info.minor}"]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


#: What a resolved set never holds: the interpreter's shared packages and torch's companion builds.
_LEFT_OUT = frozenset((*SHARED, *COMPANIONS))


def resolve(checkout: Path, out: Path) -> dict[str, object]:
    """Resolve the requirements ``checkout`` declares (see the module docstring); writes and returns
    ``{"key", "project", "requirements"}``. Raises :class:`InstallError` when pip cannot."""
    pins = shared_pins()
    with tempfile.TemporaryDirectory(prefix="specwatch-resolve-") as tmp:
        work = Path(tmp)
        project = work / "project"
        shutil.copytree(checkout, project, symlinks=True, ignore=shutil.ignore_patterns(*_NOT_COPIED))
        constraints = work / "constraints.txt"
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))
        report = work / "report.json"
        log = work / "pip.log"
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--dry-run", "--log", str(log)]
        stubs = stub_wheels(pins, work / STUB_FOLDER)  # the pins as themselves, never fetched (a +cpu torch is not on the index)
        cmd += ["--ignore-installed", "--report", str(report), "-c", str(constraints), str(project), *map(str, stubs)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=work)  # noqa: S603 - our interpreter's pip
        if done.returncode != 0 or not report.is_file():
            log_text = log.read_text(errors="replace") if log.is_file() else ""
            raise install_failure(f"the requirements of {checkout.name}", "\n".join((done.stdout, done.stderr, log_text)))
        installs = json.loads(report.read_text()).get("install", [])
    own = [item["metadata"]["name"] for item in installs if "dir_info" in item.get("download_info", {})]
    requirements = sorted(
        f"{_normalized(item['metadata']['name'])}=={item['metadata']['version']}"
        for item in installs
        if "dir_info" not in item.get("download_info", {}) and _normalized(item["metadata"]["name"]) not in _LEFT_OUT
    )
    resolved: dict[str, object] = {"key": environment_key(requirements), "project": own[0] if own else None, "requirements": requirements}
    out.write_text(json.dumps(resolved, indent=2) + "\n")
    return resolved


def install(resolved_file: Path, cache: Path) -> Path:
    """Install the set ``resolved_file`` holds (written by :func:`resolve`) into its environment folder, once;
    returns the folder. Raises :class:`InstallError` when pip cannot."""
    resolved = json.loads(resolved_file.read_text())
    requirements = [str(r) for r in resolved["requirements"]]
    key = str(resolved["key"])
    if key != environment_key(requirements):
        raise TargetError(f"{resolved_file}: its key does not match its requirements")
    folder = environment_folder(cache, key)
    if (folder / COMPLETE).is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    if requirements:
        log = folder / ".pip.log"
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--log", str(log), "--no-deps"]
        cmd += ["--upgrade", "--target", str(folder), *requirements]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603 - our interpreter's pip
        if done.returncode != 0:
            log_text = log.read_text(errors="replace") if log.is_file() else ""
            wanted = f"the dependencies of {resolved.get('project') or 'the checkout'}"
            raise install_failure(wanted, "\n".join((done.stdout, done.stderr, log_text)))
        keep_interpreter_builds(folder)
    (folder / COMPLETE).write_text("".join(f"{r}\n" for r in requirements))
    return folder


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def main(argv: list[str] | None = None) -> int:
    """``resolve CHECKOUT OUT`` or ``install OUT`` (see the module docstring)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) == 3 and args[0] == "resolve":
            resolve(Path(args[1]), Path(args[2]))
        elif len(args) == 2 and args[0] == "install":
            install(Path(args[1]), cache_root().parent)
        else:
            print("usage: python -m specwatch.targets.dependencies resolve CHECKOUT OUT | install OUT", file=sys.stderr)  # noqa: T201
            return ExitStatus.USAGE
    except InstallError as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201 - the one-line reason the worker keeps
        return ExitStatus.INSTALL
    except (TargetError, OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201
        return ExitStatus.USAGE
    return ExitStatus.OK


if __name__ == "__main__":
    sys.exit(main())
