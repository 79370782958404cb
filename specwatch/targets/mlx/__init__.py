"""MLX-LM as a target: Apple's framework, through MLX's CPU backend on Linux (Metal on a Mac).

- :mod:`.law`: MLX-LM's logits processors and sampler, in their order, as an exact law;
- :mod:`.models`: the tiny Llama target and draft built in-process, and their float64 reference;
- :mod:`.paths`: the generation paths driven (``stream_generate``/``generate``, with and without a draft model);
- :mod:`.server`: ``mlx_lm.server`` on the tiny models saved as folders, over HTTP;
- :mod:`.e2e`: the end-to-end cases; :mod:`.adapter`: what the installed release offers.

This module is the target's registry entry (:data:`TARGET`): mlx-lm requires ``mlx`` on macOS only, so elsewhere the
release is installed with MLX's CPU backend beside it (``mlx[cpu]`` at the range the release asks for on macOS).
"""

from __future__ import annotations

from specwatch.targets.registry import Distribution, TargetInfo

TARGET = TargetInfo(
    name="mlx",
    description="MLX-LM on MLX (the CPU backend on Linux): stream_generate and mlx_lm.server with a draft model",
    adapter="specwatch.targets.mlx.adapter:MlxAdapter",
    distributions=(Distribution("mlx-lm", macos_only=("mlx", "cpu")),),
)
