"""OpenVINO GenAI as a target: the engine's own logit-processing order as an exact law (:mod:`.chain`).

This module is the target's registry entry (:data:`TARGET`): a release of ``openvino-genai`` is installed with what
exporting its tiny models needs beside it, into the same release cache entry (OpenVINO GenAI runs OpenVINO IR only:
the suite exports its tiny models with optimum-intel, ``optimum-cli export openvino``, which converts the tokenizer
through openvino-tokenizers, a dependency of the release at its version). It has no adapter yet: the end-to-end cases
are not written.
"""

from __future__ import annotations

from specwatch.targets.registry import Distribution, TargetInfo

TARGET = TargetInfo(
    name="openvino",
    description="OpenVINO GenAI: its logit-processing order (end-to-end cases not written yet)",
    adapter=None,
    distributions=(Distribution("openvino-genai", beside=("optimum-intel",)),),
)
