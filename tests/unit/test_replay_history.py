"""scripts/replay_history.py lays real source distributions from a package index out as a library's git history:
real pip against a local index (tests/support/package_index.py) serving sdists built here, real git."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.package_index import PackageIndex, serve
from tests.unit.specwatch.targets.test_dependencies import BACKEND

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "replay_history.py"
PYPROJECT = '[build-system]\nrequires = []\nbuild-backend = "toy_backend"\nbackend-path = ["."]\n'


def sdist(folder: Path, version: str, files: dict[str, str]) -> Path:
    """``toy_lib-<version>.tar.gz``: a top folder holding ``files``, the in-tree backend and its metadata."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"toy_lib-{version}.tar.gz"
    contents = files | {
        "pyproject.toml": PYPROJECT,
        "toy_backend.py": BACKEND,
        "project.json": json.dumps({"name": "toy-lib", "version": version, "requires": []}),
        "PKG-INFO": f"Metadata-Version: 2.1\nName: toy-lib\nVersion: {version}\n",
    }
    with tarfile.open(path, "w:gz") as archive:
        for name, text in contents.items():
            data = text.encode()
            info = tarfile.TarInfo(f"toy_lib-{version}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def index(tmp_path: Path) -> Iterator[PackageIndex]:
    with serve(PackageIndex()) as served:
        # 1.1 changes a.py at the same size, and the archives' file times are equal: the history must still see it.
        served.publish(
            "toy-lib", "1.0", wheel=sdist(tmp_path / "dist", "1.0", {"src/toy_lib/a.py": "A = 1\n", "src/toy_lib/b.py": "B = 1\n"})
        )
        served.publish(
            "toy-lib", "1.1", wheel=sdist(tmp_path / "dist", "1.1", {"src/toy_lib/a.py": "A = 2\n", "src/toy_lib/c.py": "C = 1\n"})
        )
        yield served


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_each_release_is_one_commit_whose_tree_is_its_source_distribution(index: PackageIndex, tmp_path: Path) -> None:
    repo = tmp_path / "history"
    cmd = [sys.executable, str(SCRIPT), "toy-lib", "1.0", "1.1", "--out", str(repo), "--index-url", f"{index.url}/simple"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    commits = json.loads(done.stdout.strip().splitlines()[-1])
    assert [c["version"] for c in commits] == ["1.0", "1.1"]
    assert _git(repo, "rev-list", "--reverse", "main").split() == [c["sha"] for c in commits]
    assert [_git(repo, "rev-parse", f"v{v}^{{commit}}") for v in ("1.0", "1.1")] == [c["sha"] for c in commits]
    assert _git(repo, "log", "--format=%s %at", "--reverse", "main").splitlines() == ["toy-lib 1.0 1700000000", "toy-lib 1.1 1700086400"]
    assert _git(repo, "show", "v1.0:src/toy_lib/b.py") == "B = 1"
    assert sorted(_git(repo, "ls-tree", "-r", "--name-only", "v1.1", "src").split()) == [
        "src/toy_lib/a.py",
        "src/toy_lib/c.py",
    ]  # b.py gone
    assert _git(repo, "show", "v1.1:src/toy_lib/a.py") == "A = 2"
    assert _git(repo, "status", "--porcelain") == ""


def test_a_release_without_a_source_distribution_stops_with_pips_reason(index: PackageIndex, tmp_path: Path) -> None:
    cmd = [sys.executable, str(SCRIPT), "toy-lib", "1.0", "9.9", "--out", str(tmp_path / "h"), "--index-url", f"{index.url}/simple"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "toy-lib==9.9: no source distribution could be downloaded" in done.stderr
