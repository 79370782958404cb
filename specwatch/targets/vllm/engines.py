"""The tiny offline models and the vLLM engines of the vLLM end-to-end cases (:mod:`specwatch.targets.vllm.e2e`).

A 2-layer random Llama target and a 1-layer draft over an ``E2E_VOCAB``-token WordLevel vocabulary, and random
EAGLE-1 and EAGLE-3 heads for the target, are saved (once per process) and served by vLLM offline
(``dtype=float32``, eager, a fixed KV-cache size: the CPU build applies the default memory fraction to RAM). One
``LLM`` per engine configuration is built on first use and reused by every case that shares it, in the suite's
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: with vLLM's default engine-core processes, a second engine on the
CPU build hung for good). The float64 copy of the target is the oracle of the exact laws.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.sampling import Processing

E2E_VOCAB = 8
#: Drafts per verification step.
GAMMA = 3
#: Output-head scale of the tiny models: peaked enough that drafts are often accepted, not degenerate.
HEAD_SCALE = 4.0
_WORDS = tuple(f"w{i}" for i in range(E2E_VOCAB))
#: Target tokens the EAGLE-3 head can propose, in draft-id order (its draft vocabulary: ``d2t`` maps draft id i to
#: ``i + d2t[i]``). The others (0 and 4, about a fifth of the target's output) never come as drafts: they reach the
#: output only through the target's law at the prefill, at a rejection (the residual law) or as the bonus token.
EAGLE3_DRAFT_TOKENS = (1, 2, 3, 5, 6, 7)
#: The target's hidden states the EAGLE-3 head reads, as vLLM numbers them (``eagle_aux_hidden_state_layer_ids``):
#: 0 is the token embedding, i the residual stream after decoder layer i. The tiny target has 2 layers: vLLM's
#: default, (2, layers // 2, layers - 3), would give (-1, 1, 2), of which only two exist.
EAGLE3_AUX_LAYERS = (0, 1, 2)


class EngineError(Exception):
    """A vLLM engine could not be built or did not exercise what its case is about."""


# ------------------------------------------------------------------------------------------ models
@dataclasses.dataclass(frozen=True)
class TinyModels:
    root: Path

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def draft(self) -> Path:
        return self.root / "draft"

    @property
    def eagle(self) -> Path:
        return self.root / "eagle"

    @property
    def eagle3(self) -> Path:
        return self.root / "eagle3"


_models: TinyModels | None = None


def tiny_models() -> TinyModels:
    """The target and draft folders (built once per process, removed at exit)."""
    global _models  # noqa: PLW0603 - one copy per process, shared by every engine
    if _models is None:
        root = Path(tempfile.mkdtemp(prefix="specwatch-vllm-"))
        atexit.register(shutil.rmtree, root, True)
        save_tiny_llama(root / "target", seed=1, layers=2)
        save_tiny_llama(root / "draft", seed=2, layers=1)
        save_tiny_eagle(root / "eagle", seed=3)
        save_tiny_eagle3(root / "eagle3", target=root / "target", seed=4)
        _models = TinyModels(root)
    return _models


def save_tiny_llama(path: Path, *, seed: int, layers: int, vocab: int = E2E_VOCAB, scale: float = HEAD_SCALE) -> None:
    """A random Llama (hidden 64, 2 heads of 32: CPU attention needs a head size of 32, 64, 80, ...) saved with
    ``save_pretrained`` beside a whitespace WordLevel tokenizer over ``vocab`` words."""
    transformers = importlib.import_module("transformers")
    tokenizers = importlib.import_module("tokenizers")
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    model.save_pretrained(path)
    words = _WORDS[:vocab]
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=words[0]))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=words[0], pad_token=words[0])
    tokenizer.save_pretrained(path)


def save_tiny_eagle(path: Path, *, seed: int, vocab: int = E2E_VOCAB) -> None:
    """A random EAGLE head for the tiny target, in EAGLE-1's checkpoint layout: ``fc`` (2 hidden -> hidden, over
    [token embedding, target hidden state]) and one Llama decoder layer without its input layernorm, beside a
    Llama config. vLLM (``method="eagle"``) wraps the config as ``EagleLlamaForCausalLM`` and, since the head
    has no ``embed_tokens`` or ``lm_head`` of its own, shares the target's."""
    transformers = importlib.import_module("transformers")
    safetensors = importlib.import_module("safetensors.torch")
    save_tiny_llama(path, seed=seed, layers=1, vocab=vocab)
    state = transformers.LlamaForCausalLM.from_pretrained(path).state_dict()
    generator = torch.Generator().manual_seed(seed)
    weights = {
        name.removeprefix("model."): tensor.contiguous()
        for name, tensor in state.items()
        if name.startswith("model.layers.0.") and "input_layernorm" not in name
    }
    weights["fc.weight"] = torch.randn((64, 128), generator=generator) / 128**0.5
    for stale in path.glob("*.safetensors"):
        stale.unlink()
    safetensors.save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})


def save_tiny_eagle3(
    path: Path,
    *,
    target: Path,
    seed: int,
    draft_tokens: Sequence[int] = EAGLE3_DRAFT_TOKENS,
    aux_layers: Sequence[int] = EAGLE3_AUX_LAYERS,
) -> None:
    """A random EAGLE-3 head for the saved ``target``, in EAGLE-3's checkpoint layout (what vLLM's
    ``Eagle3LlamaForCausalLM`` loads for ``method="eagle3"``):

    - ``fc`` (3 target-hidden -> hidden) over the target's hidden states at ``aux_layers``, which the config
      names in ``eagle_aux_hidden_state_layer_ids`` (read by vLLM's model runners, v1 and v2) and again in
      ``eagle_config`` (where the head reads how many there are: ``fc``'s width);
    - ``midlayer.*``: one Llama decoder layer whose attention reads [normed token embedding, ``hidden_norm`` of
      the fused hidden state] (q/k/v of 2 hidden -> heads), then ``norm``;
    - ``lm_head`` over a draft vocabulary of ``len(draft_tokens)`` tokens, the target's output rows of those
      tokens (how EAGLE-3 heads start their training), with ``d2t`` (draft id -> target id minus draft id,
      int64) and ``t2d`` (a bool mask of the target vocabulary: which tokens the head can propose).

    No ``embed_tokens``: vLLM shares the target's. The config is the target's architecture renamed
    ``LlamaForCausalLMEagle3`` with one layer, ``draft_vocab_size`` and ``target_hidden_size``.
    """
    transformers = importlib.import_module("transformers")
    safetensors = importlib.import_module("safetensors.torch")
    tokens = list(draft_tokens)
    if len(set(tokens)) != len(tokens) or not all(0 <= t < E2E_VOCAB for t in tokens):
        raise ValueError(f"draft tokens {tokens} are not distinct target tokens below {E2E_VOCAB}")
    if len(set(aux_layers)) != len(aux_layers):
        raise ValueError(f"aux layers {list(aux_layers)} repeat (vLLM keeps one hidden state per layer id)")
    save_tiny_llama(path, seed=seed, layers=1)
    config = transformers.LlamaConfig.from_pretrained(path)
    hidden = config.hidden_size
    config.architectures = ["LlamaForCausalLMEagle3"]
    config.draft_vocab_size = len(tokens)
    config.target_hidden_size = hidden
    config.eagle_aux_hidden_state_layer_ids = list(aux_layers)
    config.eagle_config = {"eagle_aux_hidden_state_layer_ids": list(aux_layers), "use_aux_hidden_state": True}
    config.save_pretrained(path)
    generator = torch.Generator().manual_seed(seed)
    norms = ("midlayer.input_layernorm", "midlayer.hidden_norm", "midlayer.post_attention_layernorm", "norm")
    weights = {f"{name}.weight": torch.ones(hidden) for name in norms}
    heads = config.num_attention_heads * (hidden // config.num_attention_heads)
    kv = config.num_key_value_heads * (hidden // config.num_attention_heads)
    shapes = {
        "self_attn.q_proj": (heads, 2 * hidden),
        "self_attn.k_proj": (kv, 2 * hidden),
        "self_attn.v_proj": (kv, 2 * hidden),
        "self_attn.o_proj": (hidden, heads),
        "mlp.gate_proj": (config.intermediate_size, hidden),
        "mlp.up_proj": (config.intermediate_size, hidden),
        "mlp.down_proj": (hidden, config.intermediate_size),
    }
    for name, (rows, cols) in shapes.items():
        weights[f"midlayer.{name}.weight"] = torch.randn((rows, cols), generator=generator) / cols**0.5
    weights["fc.weight"] = torch.randn((hidden, len(aux_layers) * hidden), generator=generator) / (len(aux_layers) * hidden) ** 0.5
    weights["lm_head.weight"] = safetensors.load_file(str(target / "model.safetensors"))["lm_head.weight"][tokens].contiguous()
    weights["d2t"] = torch.tensor(tokens, dtype=torch.long) - torch.arange(len(tokens), dtype=torch.long)
    weights["t2d"] = torch.zeros(E2E_VOCAB, dtype=torch.bool)
    weights["t2d"][tokens] = True
    for stale in path.glob("*.safetensors"):
        stale.unlink()
    safetensors.save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})


_float64: dict[Path, Any] = {}


def target_model(models: TinyModels) -> Any:
    """The saved target in float64 (loaded once per process): the oracle of the exact laws."""
    return _float64_model(models.target)


def draft_model(models: TinyModels) -> Any:
    """The saved draft in float64 (loaded once per process): q of the expected acceptance."""
    return _float64_model(models.draft)


def _float64_model(path: Path) -> Any:
    if path not in _float64:
        transformers = importlib.import_module("transformers")
        _float64[path] = transformers.LlamaForCausalLM.from_pretrained(path).to(torch.float64).eval()
    return _float64[path]


def target_oracle(models: TinyModels, processing: Processing, prompt: Sequence[int]) -> Callable[[tuple[int, ...]], NDArray[np.float64]]:
    """p(. | prompt, prefix) of the saved target in float64 after ``processing`` (vLLM's order: temperature,
    top-k, top-p; the same semantics as :class:`Processing`)."""

    def oracle(prefix: tuple[int, ...]) -> NDArray[np.float64]:
        return processing.probs(next_token_logits(models, prompt, prefix)).numpy()

    return oracle


def next_token_logits(models: TinyModels, prompt: Sequence[int], prefix: Sequence[int]) -> torch.Tensor:
    """Raw float64 logits of the saved target's next token after prompt + prefix."""
    ids = torch.tensor([(*prompt, *prefix)], dtype=torch.long)
    with torch.no_grad():
        logits: torch.Tensor = target_model(models)(ids).logits[0, -1].double()
    return logits


def conditional_logits(
    models: TinyModels, prompt: Sequence[int], outputs: Sequence[Sequence[int]], *, draft: bool = False
) -> NDArray[np.float64]:
    """Raw float64 logits of the target (of the draft with ``draft``) at every output position, shape (trials,
    horizon, V): one no-cache forward over prompt + output for all trials at once (outputs of one length need
    no padding)."""
    ids = torch.tensor([(*prompt, *out) for out in outputs], dtype=torch.long)
    model = draft_model(models) if draft else target_model(models)
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits[:, len(prompt) - 1 : -1]
    rows: NDArray[np.float64] = logits.double().numpy()
    return rows


# ----------------------------------------------------------------------------------------- engines
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
