"""vLLM as a target: its own rejection sampler and its speculative decoding end to end, by feature detection.

- :mod:`.bindings`: ``rejection_sample`` bound by keyword from its signature (the direct path); :class:`AdapterError`;
- :mod:`.engines`: the tiny offline models, their float64 oracle and the reused vLLM engines;
- :mod:`.e2e`: ``LLM.generate`` end-to-end cases with those models against exact laws;
- :mod:`.adapter`: :class:`VllmAdapter`, what the installed vLLM offers and the cases it runs.
"""

from __future__ import annotations

from specwatch.targets.vllm.adapter import VllmAdapter
from specwatch.targets.vllm.bindings import AdapterError

__all__ = ["AdapterError", "VllmAdapter"]
