"""workers.sandbox: the bubblewrap command line, the choice of isolation, and what is never bound."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import specwatch
import workers
from specwatch import sandbox as isolation
from specwatch.index_proxy import FORWARDER
from specwatch.sandbox import Sandbox, release_entries, resolve_sandbox
from workers import sandbox as worker_sandbox
from workers import supervise as worker_supervise
from workers.sandbox import SPECWATCH_ROOT, SuiteCommand

BWRAP = Sandbox("bwrap", bwrap="/usr/bin/bwrap", read_only=(Path("/opt/python"),), devices=("/dev/null",))


def _binds(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def test_bwrap_isolates_namespaces_uid_and_capabilities() -> None:
    argv = BWRAP.argv(["python", "-V"], cwd=Path("/scratch/run-1"), writable=[Path("/scratch/run-1")])
    assert argv[0] == "/usr/bin/bwrap"
    assert "--unshare-all" in argv
    assert "--share-net" not in argv
    assert "--die-with-parent" in argv
    assert argv[argv.index("--uid") + 1] == "65534"
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert argv[argv.index("--proc") + 1] == "/proc"  # its own /proc: no process of the worker
    assert argv[-3:] == ["--", "python", "-V"]
    assert argv[argv.index("--chdir") + 1] == "/scratch/run-1"


def test_only_the_scratch_directory_is_writable_and_the_service_folder_is_not_bound() -> None:
    argv = BWRAP.argv(["python"], cwd=Path("/s"), writable=[Path("/s")], read_only=[Path("/checkout/src")])
    assert _binds(argv, "--bind") == ["/s"]
    read_only = _binds(argv, "--ro-bind") + _binds(argv, "--ro-bind-try")
    # The library the suite is (and a sampler under test imports), not the worker's own code.
    assert {"/opt/python", "/checkout/src", str(Path(specwatch.__file__).resolve().parent)} <= set(read_only)
    assert str(Path(workers.__file__).resolve().parent) not in read_only
    assert str(SPECWATCH_ROOT) not in read_only  # its .env and database stay out of reach
    assert "/etc" not in read_only
    assert "/etc/shadow" not in read_only
    assert "/etc/passwd" in read_only or not Path("/etc/passwd").exists()


def test_the_network_only_for_the_install_step_and_devices_only_on_gpu() -> None:
    install = BWRAP.argv(["pip"], cwd=Path("/s"), writable=[Path("/s")], network=True)
    assert "--share-net" in install
    assert "--dev-bind" not in install
    gpu = BWRAP.argv(["python"], cwd=Path("/s"), writable=[Path("/s")], gpu=True)
    assert _binds(gpu, "--dev-bind") == ["/dev/null"]


def test_other_modes_leave_the_command_alone() -> None:
    for mode in ("uid", "off"):
        assert Sandbox(mode).argv(["python", "-V"], cwd=Path("/s"), writable=[Path("/s")]) == ["python", "-V"]
    assert Sandbox("uid").switches_uid
    assert not BWRAP.switches_uid


def test_off_is_off() -> None:
    assert resolve_sandbox("off", sys.executable).mode == "off"


def test_bwrap_asked_for_but_missing_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    resolve_sandbox.cache_clear()
    monkeypatch.setattr(isolation.shutil, "which", lambda _: None)
    try:
        with pytest.raises(RuntimeError, match="bubblewrap"):
            resolve_sandbox("bwrap", sys.executable)
        auto = resolve_sandbox("auto", sys.executable, 65533, 65533)
        assert auto.mode in ("uid", "off")
        assert "bubblewrap (bwrap) is not installed" in auto.reason
    finally:
        resolve_sandbox.cache_clear()


def test_a_pip_run_installs_its_release_in_a_step_of_its_own() -> None:
    command = SuiteCommand(
        python="/py",
        target="transformers",
        suite_args=(),
        seed=1,
        device="cpu",
        python_path=(SPECWATCH_ROOT,),
        timeout_s=10,
        memory_limit_bytes=None,
        pip="transformers==4.46.3",
        env=(("SPECWATCH_CACHE_DIR", "/cache"),),
    )
    assert command.cache_dir == Path("/cache")
    assert command.install_argv()[0] == "/py"
    assert command.install_argv()[-1] == "transformers==4.46.3"


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_install_step_sees_the_gpu_exactly_when_the_run_does(device: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A llama-cpp-python release compiles llama.cpp in the install step, with CUDA where the worker has a GPU
    (specwatch/targets/llamacpp/build.py: cuda_device): without the GPU's device nodes there, a CUDA worker built a
    CPU-only llama.cpp and its CUDA runs tested it."""
    steps: list[list[str]] = []

    def record(self: object, argv: list[str], deadline: float, should_abort: object) -> tuple[int, bool, bool]:
        steps.append(argv)
        return 0, False, False

    monkeypatch.setattr(worker_supervise.Step, "run", record)
    command = SuiteCommand(
        python=sys.executable,
        target="llamacpp",
        suite_args=(),
        seed=1,
        device=device,
        python_path=(SPECWATCH_ROOT,),
        timeout_s=60,
        memory_limit_bytes=None,
        pip="llama-cpp-python==0.3.36",
        env=(("SPECWATCH_CACHE_DIR", str(tmp_path / "cache")),),
        sandbox=BWRAP,
    )
    (tmp_path / "scratch").mkdir()
    worker_sandbox.run_suite_process(command, tmp_path / "scratch")
    install, test = steps
    assert _binds(install, "--dev-bind") == _binds(test, "--dev-bind") == (["/dev/null"] if device == "cuda" else [])


def test_the_install_step_writes_only_its_own_release_cache_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28, item 7: the other releases' entries are read-only while a release installs (a source package's build
    runs code), its own entry is writable; checked by running the install step's real bubblewrap command line."""
    cache = tmp_path / "cache"
    other = cache / "pip" / "transformers==4.46.2"
    other.mkdir(parents=True)
    (other / ".specwatch-complete").write_text("transformers==4.46.2\n")
    steps: list[list[str]] = []

    def record(self: object, argv: list[str], deadline: float, should_abort: object) -> tuple[int, bool, bool]:
        steps.append(argv)
        return 0, False, False

    monkeypatch.setattr(worker_supervise.Step, "run", record)
    command = SuiteCommand(
        python=sys.executable,
        target="transformers",
        suite_args=(),
        seed=1,
        device="cpu",
        python_path=(SPECWATCH_ROOT,),
        timeout_s=60,
        memory_limit_bytes=None,
        pip="transformers==4.46.3",
        env=(("SPECWATCH_CACHE_DIR", str(cache)),),
        sandbox=resolve_sandbox("bwrap", sys.executable),
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    worker_sandbox.run_suite_process(command, scratch)
    install, test = steps
    assert "--share-net" not in install  # the index only, through the proxy's socket (test_index_proxy)
    assert FORWARDER in install
    assert "--share-net" not in test
    (entry,) = release_entries(cache, "transformers==4.46.3")
    probe = (
        "import sys; from pathlib import Path\n"
        "for folder in sys.argv[1:]:\n"
        "    try:\n"
        "        (Path(folder) / 'probe').write_text('x'); print(folder, 'written')\n"
        "    except OSError as exc:\n"
        "        print(folder, type(exc).__name__)\n"
    )
    argv = [*install[: install.index("--") + 1], sys.executable, "-c", probe, str(entry), str(other), str(cache / "pip")]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    assert done.stdout.splitlines() == [f"{entry} written", f"{other} OSError", f"{cache / 'pip'} OSError"]
    assert not (other / "probe").exists()
