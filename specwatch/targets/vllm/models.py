"""The tiny offline models of the vLLM end-to-end cases (:mod:`specwatch.targets.vllm.e2e`) and their exact laws.

A 2-layer random Llama target and a 1-layer draft over an ``E2E_VOCAB``-token WordLevel vocabulary, and random
EAGLE-1 and EAGLE-3 heads for the target, saved once per process for vLLM to serve (:mod:`.engines`). The float64
copy of the target is the oracle of the exact laws.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib
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
