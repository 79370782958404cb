"""Hugging Face transformers as a target: its real speculative code paths, adapted by feature detection.

One job per module, each importing only those listed before it:

- :mod:`.bindings`: the library's entry points found by looking (``_speculative_sampling`` bound by keyword
  from its signature, generation options, optional modules);
- :mod:`.observer`: the candidate generators' drafts, acceptances and rounds, recorded as coverage;
- :mod:`.models`: tiny seeded models built from one shape, and word-level tokenizers;
- :mod:`.experiments`: ``generate()`` trials against exact laws, and greedy equivalence;
- :mod:`.heads`: the drafting heads' cases (multi-token prediction, DFlash, Gemma 4 assistants);
- :mod:`.adapter`: :class:`~.adapter.TransformersAdapter`, what the installed version offers and the cases it runs;
- :mod:`.mutants`: library-level mutants planted in ``generate()`` (target ``transformers+mutant:NAME``).

This module is the target's registry entry (:data:`TARGET`, entry point ``specwatch.targets``): it imports nothing
else, so the registry is read without torch or the library.
"""

from __future__ import annotations

from specwatch.targets.registry import Distribution, TargetInfo

TARGET = TargetInfo(
    name="transformers",
    description="Hugging Face transformers: _speculative_sampling and its candidate generators",
    adapter="specwatch.targets.transformers.adapter:TransformersAdapter",
    distributions=(Distribution("transformers"),),
    variants="mutant:NAME",
)
