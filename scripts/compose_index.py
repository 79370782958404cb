# A script run by scripts/compose-test.sh (pyproject gives scripts/ no per-file ignores yet):
# ruff: noqa: T201, S603
"""The package index the compose tier serves to its stack: a release's source distribution and what installing it
needs, as static files any HTTP server can serve (``compose/ci.yml``'s ``index`` service).

    python scripts/compose_index.py DIR llama-cpp-python==0.3.36

Downloads into ``DIR/files`` (once) the release's source distribution and, as wheels for the worker image's Python
(3.11, Linux x86_64), everything pip needs to build and install it there: its build requirements and its
dependencies, read from the distribution's own ``pyproject.toml``, each with its own dependencies. Then writes, for
every project in ``DIR/files``, the pages a worker reads:

- ``DIR/simple/<project>/index.html``: PEP 503's simple API (``PIP_INDEX_URL=http://host/simple``), each link with
  its sha256;
- ``DIR/pypi/<project>/json``: the JSON API the release poller reads (``SPECWATCH_WORKER_PYPI_URL=http://host``):
  ``releases`` with each version's files.

The containers of the stack have no other index: what is not here cannot be installed, so the tier shows the
worker's own install and build step (in its sandbox, through its index proxy) fetching everything it needs.
"""

from __future__ import annotations

import hashlib
import html
import json
import subprocess
import sys
import tarfile
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

#: The worker image's interpreter (Dockerfile: PYTHON_IMAGE) and platform.
PYTHON_VERSION = "3.11"
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")


def pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"], check=False)
    if done.returncode != 0:
        sys.exit(f"compose_index: pip {' '.join(args)} exited {done.returncode}")


def requirements_of(sdist: Path) -> list[str]:
    """The build requirements and dependencies a source distribution declares in its ``pyproject.toml``."""
    with tarfile.open(sdist) as archive:
        member = next((m for m in archive.getmembers() if m.name.count("/") == 1 and m.name.endswith("/pyproject.toml")), None)
        if member is None:
            sys.exit(f"compose_index: {sdist.name} has no pyproject.toml at its top")
        extracted = archive.extractfile(member)
        assert extracted is not None
        project = tomllib.loads(extracted.read().decode())
    declared = [*project.get("build-system", {}).get("requires", []), *project.get("project", {}).get("dependencies", [])]
    return [str(Requirement(r)) for r in declared]


def download(files: Path, requirement: str) -> None:
    """The release's source distribution and its requirements' wheels into ``files``, once (a marker file says
    they are all there)."""
    name = canonicalize_name(Requirement(requirement).name)
    complete = files / f".complete-{name}-{hashlib.sha256(requirement.encode()).hexdigest()[:12]}"
    if complete.is_file():
        return
    sdists = [p for p in files.glob("*.tar.gz") if canonicalize_name(parse_sdist_filename(p.name)[0]) == name]
    if not sdists:
        pip("download", "--no-deps", "--no-binary", ":all:", "--dest", str(files), requirement)
        sdists = [p for p in files.glob("*.tar.gz") if canonicalize_name(parse_sdist_filename(p.name)[0]) == name]
    if len(sdists) != 1:
        sys.exit(f"compose_index: expected one source distribution of {requirement} in {files}, found {len(sdists)}")
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    wheels = ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp", *platforms]
    pip("download", *wheels, "--dest", str(files), *requirements_of(sdists[0]))
    complete.write_text(requirement + "\n")


def project_of(path: Path) -> tuple[str, str] | None:
    """(canonical project name, version) of a wheel or source distribution's file name; None for another file."""
    if path.name.endswith(".whl"):
        name, version, _, _ = parse_wheel_filename(path.name)
    elif path.name.endswith(".tar.gz"):
        name, version = parse_sdist_filename(path.name)
    else:
        return None
    return canonicalize_name(name), str(version)


def write_pages(root: Path) -> dict[str, int]:
    """``simple/`` and ``pypi/`` for every distribution in ``root/files``; the number of files of each project."""
    releases: dict[str, dict[str, list[dict[str, Any]]]] = {}
    links: dict[str, list[str]] = {}
    for path in sorted((root / "files").iterdir()):
        found = project_of(path)
        if found is None:
            continue
        name, version = found
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        stamp = datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat().replace("+00:00", "Z")
        entry = {
            "filename": path.name,
            "url": f"/files/{path.name}",
            "digests": {"sha256": digest},
            "packagetype": "bdist_wheel" if path.name.endswith(".whl") else "sdist",
            "upload_time_iso_8601": stamp,
            "yanked": False,
        }
        releases.setdefault(name, {}).setdefault(version, []).append(entry)
        file = html.escape(path.name)
        links.setdefault(name, []).append(f'<a href="../../files/{file}#sha256={digest}">{file}</a><br>')
    for name, versions in releases.items():
        simple = root / "simple" / name
        simple.mkdir(parents=True, exist_ok=True)
        (simple / "index.html").write_text("<!DOCTYPE html>\n<html><body>\n" + "\n".join(links[name]) + "\n</body></html>\n")
        api = root / "pypi" / name
        api.mkdir(parents=True, exist_ok=True)
        (api / "json").write_text(json.dumps({"info": {"name": name}, "releases": versions}, indent=1) + "\n")
    return {name: len(files) for name, files in links.items()}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[0])
    (root / "files").mkdir(parents=True, exist_ok=True)
    for requirement in argv[1:]:
        download(root / "files", requirement)
    counts = write_pages(root)
    print(f"compose_index: {sum(counts.values())} files of {len(counts)} projects in {root}: {', '.join(sorted(counts))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
