"""OpenVINO GenAI as a target: what the installed release offers, found by looking.

``--pip openvino-genai==X`` installs the release with optimum-intel beside it and exports the tiny models to IR in its
install step (the registry entry, :data:`specwatch.targets.openvino.TARGET`). GenAI's rejection sampling lives in
C++ (``Sampler::validate_candidate``): there is no function to call on a fixture, so the target has end-to-end cases
only (:mod:`.e2e`) and the direct sampler refuses with the reason. A path the release lacks (no ``draft_model``, no
``prompt_lookup`` or ``max_ngram_size``, no per-call speculative metrics) is skipped with the reason.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType

import torch

from specwatch.cases import Case
from specwatch.protocol import LibraryIdentity
from specwatch.sampling import Sampler
from specwatch.targets.base import Adapter, AdapterError, distribution_version, refusing_sampler

DISTRIBUTION = "openvino-genai"


@dataclass
class OpenVinoAdapter(Adapter):
    module: ModuleType
    version: str
    details: dict[str, str] = field(default_factory=dict)
    features: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def load(cls) -> OpenVinoAdapter:
        try:
            genai = importlib.import_module("openvino_genai")
            ov = importlib.import_module("openvino")
        except Exception as exc:
            raise AdapterError(f"cannot import openvino_genai and openvino: {type(exc).__name__}: {exc}") from exc
        config = genai.GenerationConfig()
        features = {
            "LLMPipeline": hasattr(genai, "LLMPipeline"),
            "draft_model": hasattr(genai, "draft_model"),
            "num_assistant_tokens": hasattr(config, "num_assistant_tokens"),
            "assistant_confidence_threshold": hasattr(config, "assistant_confidence_threshold"),
            "prompt_lookup": hasattr(config, "max_ngram_size"),
            "rng_seed": hasattr(config, "rng_seed"),
            "prefix_caching": hasattr(genai, "SchedulerConfig") and hasattr(genai.SchedulerConfig(), "enable_prefix_caching"),
            "extended_perf_metrics": hasattr(genai, "SDPerModelsPerfMetrics") or hasattr(genai, "ExtendedPerfMetrics"),
        }
        if not features["LLMPipeline"] or not features["rng_seed"]:
            raise AdapterError(f"openvino_genai {genai.__version__} has no LLMPipeline or no per-call rng_seed: nothing to drive")
        core = ov.Core()
        details = {
            "openvino_genai_build": str(genai.__version__),
            "openvino": str(ov.get_version()),
            "openvino_tokenizers": distribution_version("openvino-tokenizers"),
            "optimum_intel": distribution_version("optimum-intel"),
            "cpu": str(core.get_property("CPU", "FULL_DEVICE_NAME")),
            "inference_precision": "f32 (INFERENCE_PRECISION_HINT)",
            "torch": torch.__version__,
        }
        # The distribution's version (PEP 440, what known findings' ranges match); the build string goes in details.
        version = distribution_version(DISTRIBUTION)
        return cls(genai, version if version != "unknown" else str(genai.__version__).split("-")[0], details, features)

    def describe(self) -> LibraryIdentity:
        """The release's identity: the distribution, its version, OpenVINO's, the exporter's and the CPU it runs on."""
        return LibraryIdentity(
            name="openvino",
            distribution=DISTRIBUTION,
            version=self.version,
            path=str(getattr(self.module, "__file__", "") or ""),
            details=dict(self.details),
        )

    def sampler(self) -> Sampler:
        return refusing_sampler(
            "openvino-genai verifies drafts inside its C++ sampler (validate_candidate): no function to call on a fixture; "
            "its cases are end to end"
        )

    def cases(self) -> tuple[Case, ...]:
        from specwatch.targets.openvino.e2e import e2e_cases  # noqa: PLC0415 - the tiny models need transformers

        return e2e_cases(self)
