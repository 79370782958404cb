"""scripts/compose_index.py: the compose tier's package index, as a worker reads it (pip's simple API, the release
poller's JSON API), from a folder of distributions; and the requirements it fetches, read from the sdist itself."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from workers.pollers.releases import parse_releases

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compose_index", ROOT / "scripts" / "compose_index.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compose_index"] = module
    spec.loader.exec_module(module)
    return module


def _sdist(path: Path, pyproject: str) -> Path:
    data = pyproject.encode()
    with tarfile.open(path, "w:gz") as archive:
        info = tarfile.TarInfo(f"{path.name.removesuffix('.tar.gz')}/pyproject.toml")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return path


def test_the_pages_list_every_distribution_with_its_digest_and_the_poller_reads_the_release(tmp_path: Path) -> None:
    index = _script()
    files = tmp_path / "files"
    files.mkdir()
    sdist = _sdist(files / "llama_cpp_python-0.3.36.tar.gz", "[project]\nname='llama_cpp_python'\n")
    wheel = files / "scikit_build_core-1.1.2-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    (files / ".complete-llama-cpp-python-0123456789ab").write_text("llama-cpp-python==0.3.36\n")  # not a distribution
    assert index.write_pages(tmp_path) == {"llama-cpp-python": 1, "scikit-build-core": 1}
    page = (tmp_path / "simple" / "scikit-build-core" / "index.html").read_text()
    assert f'href="../../files/{wheel.name}#sha256={hashlib.sha256(wheel.read_bytes()).hexdigest()}"' in page
    payload = json.loads((tmp_path / "pypi" / "llama-cpp-python" / "json").read_text())
    assert [r.version for r in parse_releases(payload)] == ["0.3.36"]
    assert payload["releases"]["0.3.36"][0]["digests"]["sha256"] == hashlib.sha256(sdist.read_bytes()).hexdigest()


def test_the_requirements_are_the_sdists_build_requirements_and_dependencies(tmp_path: Path) -> None:
    index = _script()
    pyproject = (
        '[build-system]\nrequires = ["scikit-build-core[pyproject]>=0.9.2"]\n'
        '[project]\nname = "llama_cpp_python"\ndependencies = ["numpy>=1.20.0", "jinja2>=2.11.3"]\n'
        '[project.optional-dependencies]\nserver = ["uvicorn>=0.22.0"]\n'
    )
    sdist = _sdist(tmp_path / "llama_cpp_python-0.3.36.tar.gz", pyproject)
    assert index.requirements_of(sdist) == ["scikit-build-core[pyproject]>=0.9.2", "numpy>=1.20.0", "jinja2>=2.11.3"]
