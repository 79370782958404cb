"""Hugging Face transformers as a target: its real speculative code paths, adapted by feature detection.

One job per module, each importing only those listed before it:

- :mod:`.bindings`: the library's entry points found by looking (``_speculative_sampling`` bound by keyword
  from its signature, generation options, optional modules); :class:`AdapterError`;
- :mod:`.observer`: the candidate generators' drafts, acceptances and rounds, recorded as coverage;
- :mod:`.models`: tiny seeded models built from one shape, and word-level tokenizers;
- :mod:`.experiments`: ``generate()`` trials against exact laws, and greedy equivalence;
- :mod:`.heads`: the drafting heads' cases (multi-token prediction, DFlash, Gemma 4 assistants);
- :mod:`.adapter`: :class:`TransformersAdapter`, what the installed version offers and the cases it runs;
- :mod:`.mutants`: library-level mutants planted in ``generate()`` (target ``transformers+mutant:NAME``).
"""

from __future__ import annotations

from specwatch.targets.transformers.adapter import TransformersAdapter
from specwatch.targets.transformers.bindings import AdapterError

__all__ = ["AdapterError", "TransformersAdapter"]
