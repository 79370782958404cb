"""SGLang as a target: its verification kernels, the verification its engine dispatches, its engine end to end.

- :mod:`.bindings`: the verification kernels bound by keyword from their signature;
- :mod:`.tree`: a draft tree step, its exact law under target-only verification, a transcription of the kernel's rule;
- :mod:`.dispatch`: ``eagle_sample``'s choice between greedy and sampled verification (the CPU/XPU greedy fallback);
- :mod:`.cases`: the cases those make; :mod:`.e2e`: ``Engine.generate`` cases (CUDA);
- :mod:`.adapter`: :class:`~.adapter.SglangAdapter`, what the installed SGLang offers and the cases it runs.

This module is the target's registry entry (:data:`TARGET`): from 0.5 on, ``sglang`` is installed kernels-only where
torch sees no CUDA device (the wheel, :data:`KERNEL_CHAIN` and Triton).
"""

from __future__ import annotations

from specwatch.targets.registry import Distribution, TargetInfo

#: SGLang's requirements that ``import sglang.kernels.ops.speculative.verify_sampling`` (the Triton chain sampler,
#: resolved per platform) and ``sglang.srt.arg_groups.fields.spec`` (the engine's verification defaults) need, found
#: by importing them from a folder with the wheel alone (``import sglang`` runs the package's ``__init__``, which
#: reaches the language frontend and the engine's utilities). Its torchvision (CUDA-linked on the index) breaks
#: ``import sglang`` beside a CPU torch and stays out (:data:`specwatch.targets.install.COMPANIONS`), so
#: ``srt.speculative.eagle_utils``, whose imports reach the multimodal configs, is not importable there; so are the
#: CUDA-only kernel packages (sglang-kernel, flashinfer-python, ...).
KERNEL_CHAIN = (
    "aiohttp",
    "ipython",
    "msgspec",
    "orjson",
    "pillow",
    "psutil",
    "pybase64",
    "pydantic",
    "pyzmq",
    "regex",
    "requests",
    "tokenizers",
    "tqdm",
    "transformers",
)

TARGET = TargetInfo(
    name="sglang",
    description=(
        "SGLang: its verification kernels (the Triton chain sampler, classic and block; the CUDA tree kernel), the "
        "verification its engine dispatches and Engine.generate (full install on GPU workers, kernels-only on CPU)"
    ),
    adapter="specwatch.targets.sglang.adapter:SglangAdapter",
    distributions=(Distribution("sglang", kernels_only_since=(0, 5), kernel_chain=KERNEL_CHAIN),),
)
