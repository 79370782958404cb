"""llama.cpp as a target, through llama-cpp-python and the tools built from the tree it vendors.

One job per module, each importing only those listed after it (the import-linter contract):

- :mod:`.adapter`: what the installed build offers, and its cases;
- :mod:`.e2e`: the end-to-end cases; :mod:`.server_cases`: ``llama-server``'s;
- :mod:`.experiments`: a path's trials against exact laws (every token's conditional law, the first tokens' joint law),
  greedy equivalence, the forward against the reference;
- :mod:`.server`: the ``llama-server`` process and its HTTP API; :mod:`.paths`: the speculative paths driven
  (``Llama.generate`` with prompt lookup, ``llama-speculative``);
- :mod:`.models`: the tiny GGUF models and their float64 reference; :mod:`.chain`: llama.cpp's sampler chain, in its
  order, as an exact law;
- :mod:`.checkout`: ``--source`` a llama.cpp checkout, its tools built into the cache; :mod:`.build`: ``--pip
  llama-cpp-python==X`` built once per version (library and tools) into the cache, and the build's identity.

This module is the target's registry entry (:data:`TARGET`): llama-cpp-python's releases are built into their own
cache folder (``llamacpp/<version>``) by :func:`.build.build_release`, and a llama.cpp checkout is recognised and
built by :mod:`.checkout`.
"""

from __future__ import annotations

from specwatch.targets.registry import Checkout, Distribution, TargetInfo

#: The distribution whose releases the target tests (a source distribution vendoring llama.cpp).
DISTRIBUTION = "llama-cpp-python"
#: The distribution a checkout's build identity names.
SOURCE_DISTRIBUTION = "llama.cpp"
#: The cache's folder of the builds (releases: one folder per version; checkouts: ``source/<key>``).
CACHE_FOLDER = "llamacpp"

TARGET = TargetInfo(
    name="llamacpp",
    description="llama.cpp through llama-cpp-python: Llama.generate with prompt lookup and the llama-speculative tool",
    adapter="specwatch.targets.llamacpp.adapter:LlamaCppAdapter",
    distributions=(Distribution(DISTRIBUTION, built=CACHE_FOLDER, build="specwatch.targets.llamacpp.build:build_release"),),
    checkout=Checkout(
        SOURCE_DISTRIBUTION,
        recognise="specwatch.targets.llamacpp.checkout:is_llamacpp_checkout",
        build="specwatch.targets.llamacpp.checkout:build_checkout",
    ),
)
