"""The tiny random models the library targets run their end-to-end cases on, built offline from a config.

A target whose engine loads its own format (GGUF, OpenVINO IR, MLX weights) starts from the same transformers Llama:
:func:`tiny_llama`, a random float32 Llama with a peaked output head and random norms (a forward that ignored one
would not match the float64 reference), and :func:`noisy_draft`, the draft model: the target with Gaussian noise on
its output head, close enough that drafts are often accepted and different enough that q differs from p on every
row. Each target converts them, keeps a float64 copy as its reference, and says its own vocabulary and end token.
"""

from __future__ import annotations

import copy
import importlib
from typing import Any

import torch

HEAD_SCALE = 10.0
#: The draft's output-head noise, relative to the head's scale.
DRAFT_NOISE = 0.5
HIDDEN, HEADS, FFN, LAYERS = 64, 2, 128, 2
RMS_EPS = 1e-5
ROPE_THETA = 10000.0
CONTEXT = 256


def tiny_llama(*, seed: int, vocab: int, eos: int | None, layers: int = LAYERS, scale: float = HEAD_SCALE) -> Any:
    """A random transformers ``LlamaForCausalLM`` (float32, eval mode), deterministic from ``seed``."""
    transformers = importlib.import_module("transformers")
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=CONTEXT,
        rms_norm_eps=RMS_EPS,
        rope_theta=ROPE_THETA,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
        for layer in model.model.layers:  # random norms: a forward that ignored one would not match
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
            layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
        model.model.norm.weight.uniform_(0.5, 1.5)
    return model


def noisy_draft(target: Any, *, seed: int) -> Any:
    """A copy of ``target`` with :data:`DRAFT_NOISE` Gaussian noise (from ``seed``) added to its output head."""
    draft = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head = draft.lm_head.weight
        head.add_(torch.randn(head.shape, generator=generator) * DRAFT_NOISE * head.std())
    return draft
