"""SGLang as a target: its verification kernels, the verification its engine dispatches, its engine end to end.

- :mod:`.bindings`: the verification kernels bound by keyword from their signature; :class:`AdapterError`;
- :mod:`.tree`: a draft tree step, its exact law under target-only verification, a transcription of the kernel's rule;
- :mod:`.dispatch`: ``eagle_sample``'s choice between greedy and sampled verification (the CPU/XPU greedy fallback);
- :mod:`.cases`: the cases those make; :mod:`.e2e`: ``Engine.generate`` cases (CUDA);
- :mod:`.adapter`: :class:`SglangAdapter`, what the installed SGLang offers and the cases it runs.
"""

from __future__ import annotations

from specwatch.targets.sglang.adapter import SglangAdapter
from specwatch.targets.sglang.bindings import AdapterError

__all__ = ["AdapterError", "SglangAdapter"]
