"""OpenVINO GenAI as a target: ``LLMPipeline`` with a draft model, with prompt lookup, and plain, on the CPU.

- :mod:`.chain`: GenAI's logit processing, in the order it runs, as an exact law;
- :mod:`.models`: the tiny Llama target and draft, exported to OpenVINO IR once per release, and their float64 reference;
- :mod:`.pipeline`: the pipelines driven (plain, draft model, prompt lookup; prefix caching on or off), every call seeded;
- :mod:`.e2e`: the end-to-end cases; :mod:`.adapter`: what the installed release offers.

This module is the target's registry entry (:data:`TARGET`): a release of ``openvino-genai`` is installed with what
exporting its tiny models needs beside it, into the same release cache entry (OpenVINO GenAI runs OpenVINO IR only:
the suite exports its tiny models with optimum-intel, ``optimum-cli export openvino``, which converts the tokenizer
through openvino-tokenizers, a dependency of the release at its version), and its install step exports them there
(``prepare``: the step that runs the cases cannot write the cache).
"""

from __future__ import annotations

from specwatch.targets.registry import Distribution, TargetInfo

TARGET = TargetInfo(
    name="openvino",
    description="OpenVINO GenAI LLMPipeline (CPU, f32): draft-model and prompt-lookup speculative decoding",
    adapter="specwatch.targets.openvino.adapter:OpenVinoAdapter",
    distributions=(Distribution("openvino-genai", beside=("optimum-intel",), prepare="specwatch.targets.openvino.models:prepare_release"),),
)
