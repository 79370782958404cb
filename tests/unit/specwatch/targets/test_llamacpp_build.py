"""The llama.cpp build without compiling: the commands and CMake options it needs and records, what a llama.cpp
checkout (``--source``) is and what its build identity says, and which cases a checkout's build skips."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from specwatch.targets import TargetError
from specwatch.targets.llamacpp import build
from specwatch.targets.llamacpp.adapter import LlamaCppAdapter
from specwatch.targets.llamacpp.checkout import build_checkout, git_commit, is_llamacpp_checkout

pytestmark = pytest.mark.unit


def test_the_cmake_options_record_cuda_off_where_no_gpu_is_found(monkeypatch):
    found = {"nvcc": "/usr/bin/nvcc", "nvidia-smi": None}
    monkeypatch.setattr(build.shutil, "which", found.get)
    assert build.cmake_options() == [*build.CMAKE_OPTIONS, "-DGGML_CUDA=OFF"]  # a compiler without a GPU: CPU build


def test_missing_build_commands_are_named(monkeypatch):
    present = {"cmake", "g++", "make"}
    monkeypatch.setattr(build.shutil, "which", lambda name: f"/usr/bin/{name}" if name in present else None)
    assert build.missing_build_commands() == []
    present.discard("g++")
    present.discard("make")
    assert build.missing_build_commands() == ["a C++ compiler (c++ or g++ or clang++)", "a build tool (ninja or make)"]


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def test_a_checkout_is_recognised_and_its_commit_read(tmp_path):
    repo = tmp_path / "llama.cpp"
    (repo / "include").mkdir(parents=True)
    (repo / "CMakeLists.txt").write_text("project(llama)\n")
    assert not is_llamacpp_checkout(repo)
    (repo / "include" / "llama.h").write_text("// llama\n")
    assert is_llamacpp_checkout(repo)
    assert git_commit(repo) == (None, False)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "x")
    assert git_commit(repo) == (_git(repo, "rev-parse", "HEAD"), False)
    (repo / "CMakeLists.txt").write_text("project(llama2)\n")
    assert git_commit(repo) == (_git(repo, "rev-parse", "HEAD"), True)
    with pytest.raises(TargetError, match=r"not a llama\.cpp checkout"):
        build_checkout(tmp_path, tmp_path / "cache")


def test_a_checkout_build_runs_the_tools_cases_and_says_why_the_python_ones_are_skipped():
    info = {"distribution": "llama.cpp", "version": "b1", "source": "/src/llama.cpp", "llama_cpp_commit": "abc", "dirty": False}
    info |= {"cmake_options": [*build.CMAKE_OPTIONS, "-DGGML_CUDA=OFF"], "build_seconds": 3.0, "tools": {}}
    adapter = LlamaCppAdapter(None, "b1", info, {})
    described = adapter.describe()
    assert described.distribution == "llama.cpp"
    assert described.git_sha == "abc"
    assert described.path == "/src/llama.cpp"
    assert described.details["cuda"] == "off"
    skipped = {c.id: c.skip_reason for c in adapter.cases()}
    for case_id in ("e2e/python_control/plain", "e2e/python_prompt_lookup/processed", "e2e/greedy/python_prompt_lookup"):
        assert "no llama-cpp-python" in str(skipped[case_id]), case_id
    assert "no llama-cpp-python" in str(skipped["e2e/forward/gguf_reference"])
    assert "no llama-cpp-python" not in str(skipped["e2e/speculative/plain"])  # the tool's own reason (not built here)


def test_a_release_counts_as_built_once_its_identity_is_written(tmp_path):
    assert not build.release_built("llama-cpp-python==0.3.36", tmp_path)
    python = build.release_root("0.3.36", tmp_path) / "python"
    python.mkdir(parents=True)
    assert not build.release_built("llama-cpp-python==0.3.36", tmp_path)  # a build that stopped before its identity
    (python / build.BUILD_INFO).write_text("{}")
    assert build.release_built("llama-cpp-python==0.3.36", tmp_path)
    assert not build.release_built("llama-cpp-python==0.3.35", tmp_path)
    assert not build.release_built("llama-cpp-python>=0.3", tmp_path)


def test_run_source_on_a_checkout_that_does_not_build_is_a_target_error(tmp_path, monkeypatch, capsys):
    """``--source`` names the llamacpp target by the checkout's files (not its folder's name) and builds it first: a
    tree CMake cannot build is refused with exit 2 and the reason, before any case runs."""
    from specwatch.__main__ import main

    repo = tmp_path / "checkout"
    (repo / "include").mkdir(parents=True)
    (repo / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.14)\nproject(llama CXX)\n")  # no target `llama`
    (repo / "include" / "llama.h").write_text("// llama\n")
    monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["run", "--source", str(repo), "--cases", "e2e/greedy/speculative"]) == 2
    err = capsys.readouterr().err
    assert f"--source {repo}" in err
    assert "llama.cpp" in err
    assert "no target tests" not in err


def _fake_checkout(repo: Path) -> Path:
    """A git checkout with a llama.cpp checkout's marker files, at one commit."""
    (repo / "include").mkdir(parents=True)
    (repo / "CMakeLists.txt").write_text("project(llama)\n")
    (repo / "include" / "llama.h").write_text("// llama\n")
    (repo / ".gitignore").write_text("build/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "x")
    return repo


def test_a_checkout_has_a_tree_entry_only_when_it_is_exactly_a_commits_tree(tmp_path):
    from specwatch.sandbox import source_tree_entry

    cache = tmp_path / "cache"
    repo = tmp_path / "llama.cpp"
    (repo / "include").mkdir(parents=True)
    (repo / "CMakeLists.txt").write_text("project(llama)\n")
    (repo / "include" / "llama.h").write_text("// llama\n")
    assert source_tree_entry(cache, repo) is None  # not git
    _fake_checkout(tmp_path / "clean")
    clean = tmp_path / "clean"
    tree = _git(clean, "rev-parse", "HEAD^{tree}")
    assert source_tree_entry(cache, clean) == cache / "llamacpp" / "tree" / tree
    (clean / "build").mkdir()
    (clean / "build" / "x.o").write_text("ignored")
    assert source_tree_entry(cache, clean) == cache / "llamacpp" / "tree" / tree  # ignored files do not count
    (clean / "extra.cpp").write_text("// untracked\n")
    assert source_tree_entry(cache, clean) is None
    (clean / "extra.cpp").unlink()
    (clean / "CMakeLists.txt").write_text("project(llama2)\n")
    assert source_tree_entry(cache, clean) is None
    assert source_tree_entry(cache, tmp_path) is None  # not a llama.cpp checkout


def test_a_tree_build_is_made_once_and_reused_by_later_runs_of_the_same_tree(tmp_path, monkeypatch):
    from specwatch.targets.llamacpp import checkout as source

    built: list[Path] = []

    def fake_build(tree, build_dir, log_path, requirement, tools):
        built.append(build_dir)
        build_dir.mkdir(parents=True, exist_ok=True)
        return [*build.CMAKE_OPTIONS, "-DGGML_CUDA=OFF"], {}

    monkeypatch.setattr(source, "cmake_build", fake_build)
    cache = tmp_path / "cache"
    repo = _fake_checkout(tmp_path / "llama.cpp")
    first = build_checkout(repo, cache, tree=True, log=False)
    assert first.is_relative_to(cache / "llamacpp" / "tree" / _git(repo, "rev-parse", "HEAD^{tree}"))
    assert build_checkout(repo, cache, log=False) == first  # reused, sandboxed or not: nothing compiled
    assert build_checkout(repo, cache, tree=True, log=False) == first
    assert len(built) == 1
    (repo / "include" / "llama.h").write_text("// llama, next commit\n")
    with pytest.raises(TargetError, match="without changes"):
        build_checkout(repo, cache, tree=True, log=False)
    _git(repo, "commit", "-q", "-am", "next")
    second = build_checkout(repo, cache, tree=True, log=False)
    assert second != first  # another tree, an entry of its own
    assert len(built) == 2


def _sdist(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)
    return path


@pytest.mark.parametrize("filters", [True, False], ids=["tarfile filters", "Python 3.11 before 3.11.4"])
def test_a_release_is_extracted_inside_its_folder_only(filters, tmp_path, monkeypatch):
    """The compose tier's stand-in image runs Debian bookworm's Python 3.11.2, whose tarfile has no ``filter``: the
    release's extraction failed there with a TypeError. Both ways extract a plain distribution and refuse a member
    that leaves the release's folder."""
    import tarfile

    if not filters:
        monkeypatch.delattr(tarfile, "data_filter")
    good = _sdist(tmp_path / "pkg-1.0.tar.gz", {"pkg-1.0/pyproject.toml": b"[project]\n"}, {"pkg-1.0/link": "pyproject.toml"})
    top = build._extract(good, tmp_path / "out")
    assert (top / "pyproject.toml").read_bytes() == b"[project]\n"
    for name, members, links in (
        ("up-1.0", {"up-1.0/../../evil": b"x"}, {}),
        ("abs-1.0", {"/tmp/evil-abs": b"x"}, {}),
        ("sym-1.0", {"sym-1.0/a": b"x"}, {"sym-1.0/out": "../../../etc/passwd"}),
    ):
        bad = _sdist(tmp_path / f"{name}.tar.gz", members, links)
        with pytest.raises((TargetError, tarfile.FilterError) if filters else TargetError):
            build._extract(bad, tmp_path / name)
    assert not (tmp_path / "evil").exists()
    assert not Path("/tmp/evil-abs").exists()  # the path the archive names
