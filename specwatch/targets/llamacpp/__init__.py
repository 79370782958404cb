"""llama.cpp as a target, through llama-cpp-python and the tools built from the tree it vendors.

- :mod:`.build`: ``--pip llama-cpp-python==X`` built once per version (library and tools) into the cache;
- :mod:`.chain`: llama.cpp's sampler chain, in its order, as an exact law;
- :mod:`.models`: the tiny GGUF models and their float64 reference;
- :mod:`.paths`: the speculative paths driven (``Llama.generate`` with prompt lookup, ``llama-speculative``);
- :mod:`.e2e`: the end-to-end cases; :mod:`.adapter`: what the installed build offers.
"""
