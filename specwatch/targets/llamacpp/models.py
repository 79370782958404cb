"""Tiny random models of the llama.cpp target, written as GGUF (F32), and their float64 reference forward.

A 2-layer random Llama target and a draft (the target with a perturbed output head) over :data:`VOCAB` one-character
tokens (hidden 64, 2 heads of 32), built with transformers from a config, written as GGUF with the ``gguf`` package
the way the vendored ``convert_hf_to_gguf.py`` writes a Llama (Q and K rows permuted from Hugging Face's rotate-half
layout to llama.cpp's interleaved RoPE). The tokenizer is a SentencePiece-style Unigram model built with
``tokenizers`` (one piece per character, no BOS, no space prefix), written as llama.cpp's ``llama`` (SPM) vocabulary:
a text prompt over the characters tokenizes to one token per character in both. The float64 copy of the transformers
model is the oracle of the exact laws; :func:`~specwatch.targets.llamacpp.paths.forward_difference` is the check that
llama.cpp computes the same function within float32 noise.
"""

from __future__ import annotations

import atexit
import importlib
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.targets import tiny
from specwatch.targets.tiny import CONTEXT, HEAD_SCALE, RMS_EPS, ROPE_THETA, noisy_draft

#: The characters of the vocabulary, in id order; ``EOS`` is the end-of-generation token llama.cpp knows.
PIECES = ("a", "b", "c", "d", "e", "f", "g", "h")
VOCAB = len(PIECES)
EOS = VOCAB - 1


@dataclass(frozen=True)
class TinyModels:
    root: Path

    @property
    def target(self) -> Path:
        return self.root / "target.gguf"

    @property
    def draft(self) -> Path:
        return self.root / "draft.gguf"


_models: TinyModels | None = None
_float64: dict[str, Any] = {}


def tiny_models() -> TinyModels:
    """The target and draft GGUF files (written once per process, removed at exit)."""
    global _models  # noqa: PLW0603 - one copy per process
    if _models is None:
        root = Path(tempfile.mkdtemp(prefix="specwatch-llamacpp-"))
        atexit.register(shutil.rmtree, root, True)
        target = tiny_llama(seed=1, layers=2)
        draft = noisy_draft(target, seed=2)
        for name, model in (("target", target), ("draft", draft)):
            write_gguf(model, root / f"{name}.gguf", name=f"specwatch-tiny-{name}")
            _float64[name] = model.to(torch.float64).eval()
        _models = TinyModels(root)
    return _models


def tiny_llama(*, seed: int, layers: int, vocab: int = VOCAB, scale: float = HEAD_SCALE) -> Any:
    """A random transformers Llama (float32) with a peaked output head (:func:`specwatch.targets.tiny.tiny_llama`)."""
    return tiny.tiny_llama(seed=seed, vocab=vocab, eos=EOS, layers=layers, scale=scale)


def tokenizer() -> Any:
    """The ``tokenizers`` Unigram model over :data:`PIECES` (SentencePiece's model type, one piece per character)."""
    tokenizers = importlib.import_module("tokenizers")
    vocab = [(piece, -float(i + 1)) for i, piece in enumerate(PIECES)]
    return tokenizers.Tokenizer(tokenizers.models.Unigram(vocab, unk_id=0, byte_fallback=False))


def _permute(weight: NDArray[np.float32], heads: int) -> NDArray[np.float32]:
    """Hugging Face's rotate-half Q/K rows to llama.cpp's interleaved RoPE rows (``LlamaModel.permute`` of the
    vendored ``convert_hf_to_gguf.py``)."""
    out: NDArray[np.float32] = (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )
    return out


def write_gguf(model: Any, path: Path, *, name: str) -> None:
    """``model`` (a transformers Llama) as an F32 GGUF file with the :func:`tokenizer` vocabulary."""
    gguf = importlib.import_module("gguf")
    config = model.config
    state = {k: v.detach().to(torch.float32).numpy() for k, v in model.state_dict().items()}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    ids = tokenizer().get_vocab()
    ordered = sorted(ids, key=ids.__getitem__)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(ordered)
    writer.add_token_scores([-float(i + 1) for i in range(len(ordered))])
    writer.add_token_types([gguf.TokenType.NORMAL] * len(ordered))
    writer.add_unk_token_id(0)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    heads = config.num_attention_heads
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        writer.add_tensor(f"blk.{i}.attn_norm.weight", state[p + "input_layernorm.weight"])
        writer.add_tensor(f"blk.{i}.attn_q.weight", _permute(state[p + "self_attn.q_proj.weight"], heads))
        writer.add_tensor(f"blk.{i}.attn_k.weight", _permute(state[p + "self_attn.k_proj.weight"], config.num_key_value_heads))
        writer.add_tensor(f"blk.{i}.attn_v.weight", state[p + "self_attn.v_proj.weight"])
        writer.add_tensor(f"blk.{i}.attn_output.weight", state[p + "self_attn.o_proj.weight"])
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", state[p + "post_attention_layernorm.weight"])
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", state[p + "mlp.gate_proj.weight"])
        writer.add_tensor(f"blk.{i}.ffn_up.weight", state[p + "mlp.up_proj.weight"])
        writer.add_tensor(f"blk.{i}.ffn_down.weight", state[p + "mlp.down_proj.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def reference(name: str = "target") -> Any:
    """The float64 transformers copy of the tiny ``target`` or ``draft`` (what the GGUF files hold)."""
    tiny_models()
    return _float64[name]


def text(tokens: Sequence[int]) -> str:
    return "".join(PIECES[t] for t in tokens)


def tokens_of(text_: str) -> list[int]:
    return [PIECES.index(c) for c in text_]


def next_token_logits(prompt: Sequence[int], prefix: Sequence[int], *, model: str = "target") -> NDArray[np.float64]:
    """Raw float64 logits of the next token after prompt + prefix."""
    ids = torch.tensor([(*prompt, *prefix)], dtype=torch.long)
    with torch.no_grad():
        out: NDArray[np.float64] = reference(model)(ids).logits[0, -1].double().numpy()
    return out


def conditional_logits(prompt: Sequence[int], outputs: Sequence[Sequence[int]], *, model: str = "target") -> NDArray[np.float64]:
    """Raw float64 logits at every output position, shape (trials, horizon, V): one no-cache forward over prompt +
    output for all trials at once (outputs of one length)."""
    ids = torch.tensor([(*prompt, *out) for out in outputs], dtype=torch.long)
    with torch.no_grad():
        logits = reference(model)(ids, use_cache=False).logits[:, len(prompt) - 1 : -1]
    rows: NDArray[np.float64] = logits.double().numpy()
    return rows


def all_logits(tokens: Sequence[int], *, model: str = "target") -> NDArray[np.float64]:
    """float64 logits at every position of ``tokens`` (shape (len, V))."""
    with torch.no_grad():
        out: NDArray[np.float64] = reference(model)(torch.tensor([list(tokens)]), use_cache=False).logits[0].double().numpy()
    return out


#: Largest |llama.cpp logit - float64 logit| accepted as float32 noise (F32 weights and KV cache: about 1e-6 seen).
FORWARD_TOLERANCE = 1e-4
