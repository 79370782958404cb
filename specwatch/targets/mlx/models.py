"""Tiny random models of the MLX-LM target, built in-process, and their float64 reference forward.

A 2-layer random Llama target and a draft (the target with a perturbed output head) over :data:`VOCAB` one-character
tokens (hidden 64, 2 heads of 32), built with transformers from a config (float32, seeded), then copied into
``mlx_lm.models.llama.Model`` of the same shape (the parameter names and the rotate-half RoPE layout are the same:
no permutation). Nothing is downloaded. The tokenizer is a ``tokenizers`` word-level model with one token per
character and no special tokens, wrapped as transformers' fast tokenizer and mlx-lm's ``TokenizerWrapper``: no EOS,
so a call generates exactly ``max_tokens`` tokens. The float64 copy of the transformers model is the oracle of the
exact laws; :func:`forward_difference` checks that MLX computes the same function within float32 noise.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.targets.tiny import FFN, HEADS, HIDDEN, LAYERS, RMS_EPS, ROPE_THETA, noisy_draft, tiny_llama

PIECES = ("a", "b", "c", "d", "e", "f", "g", "h")
VOCAB = len(PIECES)
#: Largest |MLX logit - float64 logit| accepted as float32 noise (about 2e-6 seen on random sequences of 40 tokens).
FORWARD_TOLERANCE = 1e-4

_torch_models: dict[str, Any] = {}
_mlx_models: dict[str, Any] = {}
_tokenizer: list[Any] = []


def torch_models() -> dict[str, Any]:
    """The float32 transformers target and draft (built once per process, seeded)."""
    if not _torch_models:
        target = tiny_llama(seed=1, vocab=VOCAB, eos=None)
        draft = noisy_draft(target, seed=2)
        _torch_models.update(target=target, draft=draft)
        _torch_models.update({f"{name}64": copy.deepcopy(m).to(torch.float64).eval() for name, m in (("target", target), ("draft", draft))})
    return _torch_models


def mlx_model(name: str = "target") -> Any:
    """``mlx_lm.models.llama.Model`` holding the weights of the tiny ``target`` or ``draft`` (float32)."""
    if name not in _mlx_models:
        mx = importlib.import_module("mlx.core")
        llama = importlib.import_module("mlx_lm.models.llama")
        args = llama.ModelArgs(
            model_type="llama",
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            intermediate_size=FFN,
            num_attention_heads=HEADS,
            rms_norm_eps=RMS_EPS,
            vocab_size=VOCAB,
            num_key_value_heads=HEADS,
            rope_theta=ROPE_THETA,
            tie_word_embeddings=False,
        )
        model = llama.Model(args)
        state = torch_models()[name].state_dict()
        model.load_weights([(k, mx.array(v.detach().to(torch.float32).numpy())) for k, v in state.items()], strict=True)
        mx.eval(model.parameters())
        _mlx_models[name] = model
    return _mlx_models[name]


def tokenizer() -> Any:
    """mlx-lm's ``TokenizerWrapper`` over a word-level fast tokenizer: one token per character of :data:`PIECES`, no
    special tokens (no EOS: a call generates exactly ``max_tokens`` tokens)."""
    if not _tokenizer:
        tokenizers = importlib.import_module("tokenizers")
        transformers = importlib.import_module("transformers")
        wrapper = importlib.import_module("mlx_lm.tokenizer_utils").TokenizerWrapper
        model = tokenizers.Tokenizer(tokenizers.models.WordLevel({c: i for i, c in enumerate(PIECES)}, unk_token=PIECES[0]))
        model.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
        model.decoder = tokenizers.decoders.Fuse()  # one character a token, joined without spaces
        _tokenizer.append(wrapper(transformers.PreTrainedTokenizerFast(tokenizer_object=model)))
    return _tokenizer[0]


def text(tokens: Sequence[int]) -> str:
    return "".join(PIECES[t] for t in tokens)


def tokens_of(text_: str) -> list[int]:
    return [PIECES.index(c) for c in text_]


def next_token_logits(prompt: Sequence[int], prefix: Sequence[int], *, model: str = "target") -> NDArray[np.float64]:
    """Raw float64 logits of the next token after prompt + prefix."""
    ids = torch.tensor([(*prompt, *prefix)], dtype=torch.long)
    with torch.no_grad():
        out: NDArray[np.float64] = torch_models()[f"{model}64"](ids).logits[0, -1].double().numpy()
    return out


def conditional_logits(prompt: Sequence[int], outputs: Sequence[Sequence[int]], *, model: str = "target") -> NDArray[np.float64]:
    """Raw float64 logits at every output position, shape (trials, horizon, V): one no-cache forward over prompt +
    output for all trials at once (outputs of one length)."""
    ids = torch.tensor([(*prompt, *out) for out in outputs], dtype=torch.long)
    with torch.no_grad():
        logits = torch_models()[f"{model}64"](ids, use_cache=False).logits[:, len(prompt) - 1 : -1]
    rows: NDArray[np.float64] = logits.double().numpy()
    return rows


def forward_difference(tokens: Sequence[int]) -> float:
    """Largest |MLX logit - float64 logit| of the target over ``tokens`` (one forward, every position)."""
    mx = importlib.import_module("mlx.core")
    got = np.array(mlx_model("target")(mx.array([list(tokens)]))[0].astype(mx.float32), dtype=np.float64)
    with torch.no_grad():
        want = torch_models()["target64"](torch.tensor([list(tokens)]), use_cache=False).logits[0].double().numpy()
    return float(np.abs(got - want).max())
