"""A checkout's declared dependencies, resolved and installed once per resolved set: real pip against a local
package index (tests/support/package_index.py) and checkouts that declare their project with an in-tree PEP 517
backend (nothing to download to read their metadata)."""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from specwatch.protocol import ExitStatus
from specwatch.sandbox import PROJECT_FILES, declares_project, environment_folder
from specwatch.targets.dependencies import environment_key, install, main, resolve
from specwatch.targets.install import InstallError
from tests.support.package_index import PackageIndex, build_wheel, serve

pytestmark = pytest.mark.unit

BACKEND = '''
"""An in-tree build backend: the project's metadata from project.json, no download."""
import json, pathlib

def _meta():
    return json.loads(pathlib.Path(__file__).with_name("project.json").read_text())

def get_requires_for_build_wheel(config_settings=None):
    return []

def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    meta = _meta()
    name = f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    folder = pathlib.Path(metadata_directory) / name
    folder.mkdir()
    lines = [f"Metadata-Version: 2.1", f"Name: {meta['name']}", f"Version: {meta['version']}"]
    lines += [f"Requires-Dist: {r}" for r in meta["requires"]]
    (folder / "METADATA").write_text("\\n".join(lines) + "\\n")
    return name

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    raise RuntimeError("a dry run reads the metadata only")
'''


def checkout(folder: Path, requires: list[str], *, name: str = "toylib", version: str = "1.0") -> Path:
    """A checkout that declares ``name`` ``version`` requiring ``requires`` (and a module of its own under src/)."""
    (folder / "src" / name).mkdir(parents=True)
    (folder / "src" / name / "__init__.py").write_text("")
    (folder / "toy_backend.py").write_text(BACKEND)
    (folder / "project.json").write_text(json.dumps({"name": name, "version": version, "requires": requires}))
    pyproject = """
        [build-system]
        requires = []
        build-backend = "toy_backend"
        backend-path = ["."]
    """
    (folder / "pyproject.toml").write_text(textwrap.dedent(pyproject))
    return folder


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PackageIndex]:
    """A local index holding two releases of a dependency (one of them needing another), and a cache of the test's."""
    with serve(PackageIndex()) as served:
        monkeypatch.setenv("PIP_INDEX_URL", f"{served.url}/simple")
        monkeypatch.setenv("PIP_RETRIES", "0")
        monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(tmp_path / "cache"))
        dist = tmp_path / "dist"
        for version in ("1.0", "2.0"):
            files = {"toydep/__init__.py": f"VERSION = {version!r}\n"}
            requires = ("toydep-extra==0.5",) if version == "2.0" else ()
            served.publish("toydep", version, wheel=build_wheel(dist, "toydep", version, files, requires))
        served.publish("toydep-extra", "0.5", wheel=build_wheel(dist, "toydep-extra", "0.5", {"toydep_extra/__init__.py": ""}))
        yield served


def test_each_commit_gets_the_dependency_versions_it_declares(index: PackageIndex, tmp_path: Path) -> None:
    old = resolve(checkout(tmp_path / "old", ["toydep==1.0"]), tmp_path / "old.json")
    new = resolve(checkout(tmp_path / "new", ["toydep>=2"]), tmp_path / "new.json")
    assert old["requirements"] == ["toydep==1.0"]
    assert new["requirements"] == ["toydep-extra==0.5", "toydep==2.0"]  # with its own dependency, resolved
    assert old["project"] == new["project"] == "toylib"  # the checkout itself comes from its tree, never installed
    assert old["key"] != new["key"]
    cache = tmp_path / "cache"
    old_env, new_env = install(tmp_path / "old.json", cache), install(tmp_path / "new.json", cache)
    assert old_env == environment_folder(cache, str(old["key"]))
    assert (old_env / "toydep" / "__init__.py").read_text() == "VERSION = '1.0'\n"
    assert (new_env / "toydep" / "__init__.py").read_text() == "VERSION = '2.0'\n"
    assert (new_env / "toydep_extra").is_dir()
    assert not (old_env / "toydep_extra").exists()


def test_a_checkout_needing_torch_resolves_against_the_interpreters_torch_the_index_lacks(
    index: PackageIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local index has no torch, numpy or scipy (as PyPI has no ``+cpu`` torch) and pip knows no other place
    (no configuration files, no find-links): the set resolves, without them and without asking for them."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)
    resolved = resolve(checkout(tmp_path / "t", ["torch>=1", "numpy", "toydep==1.0"]), tmp_path / "t.json")
    assert resolved["requirements"] == ["toydep==1.0"]
    assert not any(path.startswith(("/simple/torch", "/simple/numpy")) for path in index.requests)


def test_commits_with_the_same_resolved_set_share_one_environment(
    index: PackageIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = resolve(checkout(tmp_path / "a", ["toydep==1.0"]), tmp_path / "a.json")
    second = resolve(checkout(tmp_path / "b", ["toydep<2"], version="1.1"), tmp_path / "b.json")  # another spelling
    assert first["key"] == second["key"] == environment_key(["toydep==1.0"])
    folder = install(tmp_path / "a.json", tmp_path / "cache")
    index.requests.clear()
    assert install(tmp_path / "b.json", tmp_path / "cache") == folder
    assert index.requests == []  # installed once: the second commit asked the index nothing


def test_a_checkout_whose_dependencies_cannot_be_resolved_is_uninstallable_with_the_reason(index: PackageIndex, tmp_path: Path) -> None:
    project = checkout(tmp_path / "c", ["toydep==9.9"])
    with pytest.raises(InstallError) as raised:
        resolve(project, tmp_path / "c.json")
    assert raised.value.cause == "missing"
    assert "toydep==9.9" in str(raised.value)
    assert main(["resolve", str(project), str(tmp_path / "c.json")]) == ExitStatus.INSTALL
    assert not (tmp_path / "c.json").exists()


def test_a_tampered_set_is_refused_and_nothing_is_installed(index: PackageIndex, tmp_path: Path) -> None:
    resolve(checkout(tmp_path / "d", ["toydep==1.0"]), tmp_path / "d.json")
    resolved = json.loads((tmp_path / "d.json").read_text())
    resolved["requirements"] = ["toydep==2.0"]
    (tmp_path / "d.json").write_text(json.dumps(resolved))
    assert main(["install", str(tmp_path / "d.json")]) == ExitStatus.USAGE
    assert not (tmp_path / "cache" / "envs").exists()


def test_only_a_declared_project_has_dependencies_to_resolve(tmp_path: Path) -> None:
    assert not declares_project(tmp_path)
    for name in PROJECT_FILES:
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        (folder / name).write_text("")
        assert declares_project(folder)
