"""The vLLM engines of the vLLM end-to-end cases (:mod:`specwatch.targets.vllm.e2e`).

The tiny models of :mod:`.models` are served by vLLM offline
(``dtype=float32``, eager, a fixed KV-cache size: the CPU build applies the default memory fraction to RAM). One
``LLM`` per engine configuration is built on first use and reused by every case that shares it, in the suite's
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: with vLLM's default engine-core processes, a second engine on the
CPU build hung for good). The float64 copy of the target is the oracle of the exact laws.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import os
from typing import Any

from specwatch.sampling import Processing
from specwatch.targets.vllm.models import TinyModels, tiny_models

#: Drafts per verification step.
GAMMA = 3


class EngineError(Exception):
    """A vLLM engine could not be built or did not exercise what its case is about."""


def speculative_configs(vllm: Any, models: TinyModels) -> dict[str, dict[str, Any] | None]:
    """Engine configurations this release can run on this machine, by name (``None``: no speculation)."""
    configs: dict[str, dict[str, Any] | None] = {
        "plain": None,
        "ngram": {"method": "ngram", "num_speculative_tokens": GAMMA, "prompt_lookup_max": 2, "prompt_lookup_min": 1},
        "draft_model": {"model": str(models.draft), "num_speculative_tokens": GAMMA},
        "draft_model_probabilistic": {"model": str(models.draft), "num_speculative_tokens": GAMMA, "draft_sample_method": "probabilistic"},
        "eagle": {"method": "eagle", "model": str(models.eagle), "num_speculative_tokens": GAMMA},
        "eagle3": {"method": "eagle3", "model": str(models.eagle3), "num_speculative_tokens": GAMMA},
    }
    missing = unavailable(vllm)
    return {name: config for name, config in configs.items() if name not in missing}


def unavailable(vllm: Any) -> dict[str, str]:
    """Engine configurations this release lacks, with the reason (feature detection, not version tables)."""
    version = getattr(vllm, "__version__", "unknown")
    missing: dict[str, str] = {}
    if "draft_sample_method" not in speculative_config_fields(vllm):
        missing["draft_model_probabilistic"] = f"vllm {version} has no draft_sample_method"
    try:
        eagle = importlib.util.find_spec("vllm.model_executor.models.llama_eagle")
    except ImportError:
        eagle = None
    if eagle is None:
        missing["eagle"] = f"vllm {version} has no EAGLE Llama head (vllm.model_executor.models.llama_eagle)"
    eagle3 = _eagle3_unavailable(vllm)
    if eagle3 is not None:
        missing["eagle3"] = f"vllm {version} {eagle3}"
    return missing


def _eagle3_unavailable(vllm: Any) -> str | None:
    """Why this release cannot run the tiny EAGLE-3 head (None: it can): it needs the EAGLE-3 Llama head, a Llama
    target that returns aux hidden states (``SupportsEagle3``) and a model runner that takes the aux layers from
    the head's config."""
    try:
        head = importlib.util.find_spec("vllm.model_executor.models.llama_eagle3")
    except ImportError:
        head = None
    if head is None:
        return "has no EAGLE-3 Llama head (vllm.model_executor.models.llama_eagle3)"
    try:
        interfaces = importlib.import_module("vllm.model_executor.models.interfaces")
        llama = importlib.import_module("vllm.model_executor.models.llama")
    except ImportError as exc:
        return f"cannot import its Llama model ({exc})"
    supports = getattr(interfaces, "supports_eagle3", None)
    if supports is None or not supports(llama.LlamaForCausalLM):
        return "has no EAGLE-3 support in its Llama target (SupportsEagle3)"
    if not _reads_aux_layers_from_config():
        return (
            "takes EAGLE-3's aux hidden states from its default layers (2, layers // 2, layers - 3), not from the head's "
            "eagle_aux_hidden_state_layer_ids: the 2-layer tiny target has only 2 of them"
        )
    return None


def _reads_aux_layers_from_config() -> bool:
    """Whether a model runner of this release takes EAGLE-3's aux layers from the head's config: the v1 runner's
    ``_get_eagle3_aux_layers_from_config`` (the CPU runner inherits it) or model runner v2's
    ``get_eagle3_aux_layers_from_config``."""
    with contextlib.suppress(ImportError):
        runner = importlib.import_module("vllm.v1.worker.gpu_model_runner")
        if hasattr(getattr(runner, "GPUModelRunner", None), "_get_eagle3_aux_layers_from_config"):
            return True
    with contextlib.suppress(ImportError):
        return hasattr(importlib.import_module("vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils"), "get_eagle3_aux_layers_from_config")
    return False


def speculative_config_fields(vllm: Any) -> set[str]:
    """Field names of ``vllm.config.SpeculativeConfig`` (a pydantic dataclass), empty if it cannot be found."""
    try:
        cls = importlib.import_module("vllm.config").SpeculativeConfig
    except (ImportError, AttributeError):
        return set()
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(getattr(cls, "model_fields", {}))


def engine_fields(vllm: Any) -> set[str]:
    """Field names of ``vllm.engine.arg_utils.EngineArgs`` (what ``LLM(...)`` accepts), empty if not found."""
    try:
        cls = importlib.import_module("vllm.engine.arg_utils").EngineArgs
    except (ImportError, AttributeError):
        return set()
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


def records_verification_steps(vllm: Any) -> bool:
    """Whether this release itemises each request's verification steps (``per_request_spec_decode_metrics``)."""
    return "per_request_spec_decode_metrics" in engine_fields(vllm)


_engines: dict[str, Any] = {}


def engine(name: str) -> Any:
    """The ``LLM`` of engine configuration ``name``, built on first use and reused (one per configuration)."""
    if name not in _engines:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read when the engine is built
        vllm = importlib.import_module("vllm")
        models = tiny_models()
        configs = speculative_configs(vllm, models)
        if name not in configs:
            raise EngineError(f"vllm {vllm.__version__} has no engine configuration {name!r}")
        extra: dict[str, Any] = {}
        if configs[name] is not None and records_verification_steps(vllm):
            # Each output then carries its drafts and accepted drafts per verification step (.acceptance).
            extra["per_request_spec_decode_metrics"] = "detailed"
        try:
            _engines[name] = vllm.LLM(
                model=str(models.target),
                dtype="float32",
                enforce_eager=True,
                max_model_len=64,
                kv_cache_memory_bytes=256 << 20,
                seed=0,
                disable_log_stats=False,
                speculative_config=configs[name],
                **extra,
            )
        except Exception as exc:
            raise EngineError(f"cannot build the {name} engine: {type(exc).__name__}: {exc}") from exc
    return _engines[name]


def discard_engines() -> None:
    """Shut every engine down and forget it (after one raised): the next case that needs one builds it afresh.

    The engine that raised may still hold the failed requests in its scheduler. Shutting an in-process engine down
    tears down the distributed state every engine of the process shares (``EngineCore.shutdown`` calls vLLM's
    ``cleanup_dist_env_and_memory``), so the others go too. Shut down here, not left to the garbage collector:
    vLLM's finalizer, run whenever the collector reaches the dropped engine, destroyed that state in the middle
    of building the next engine ("pipeline model parallel group is not initialized").
    """
    while _engines:
        _, llm = _engines.popitem()
        shutdown = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None), "shutdown", None)
        if shutdown is not None:
            with contextlib.suppress(Exception):  # an engine that cannot shut down cleanly is dropped all the same
                shutdown()


def sampling_params(vllm: Any, processing: Processing, length: int, seed: int) -> Any:
    return vllm.SamplingParams(
        temperature=processing.temperature,
        top_k=processing.top_k if processing.top_k is not None else -1,
        top_p=processing.top_p if processing.top_p is not None else 1.0,
        max_tokens=length,
        ignore_eos=True,
        seed=seed,
    )
