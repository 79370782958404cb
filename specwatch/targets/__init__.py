"""Targets: what the suite tests. ``reference``, ``mutant:NAME``, ``module:function`` or a library target registered
in :mod:`.registry` (``transformers``, ``vllm``, ``sglang``, ``llamacpp``: the installed package, whatever version is
importable; ``transformers+mutant:NAME``: transformers with a library-level mutant planted in it).

- :mod:`.loader`: :func:`~.loader.resolve`, a target spec to its sampler, cases and library identity;
- :mod:`.registry`: the library targets, found through the entry point group ``specwatch.targets`` (torch-free);
- :mod:`.base`: the adapter kit the library targets fill in; each is a package beside this module
  (:mod:`.transformers`, :mod:`.vllm`, :mod:`.sglang`, :mod:`.llamacpp`) whose ``__init__`` is its registry entry;
- :mod:`.install`: which copy of a library is tested (a pip release or a source checkout).

This module imports nothing: the sandbox and the server read the registry without torch.
"""

from __future__ import annotations


class TargetError(Exception):
    """The target cannot be loaded: a usage or import problem, not a violation."""
