"""MLX-LM as a target: Apple's framework, through MLX's CPU backend on Linux (Metal on a Mac).

- :mod:`.law`: MLX-LM's logits processors and sampler, in their order, as an exact law;
- :mod:`.models`: the tiny Llama target and draft built in-process, and their float64 reference;
- :mod:`.paths`: the generation paths driven (``stream_generate``/``generate``, with and without a draft model);
- :mod:`.e2e`: the end-to-end cases; :mod:`.adapter`: what the installed release offers.
"""
