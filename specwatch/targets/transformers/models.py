"""Tiny randomly initialised models (seeded) and word-level tokenizers for the end-to-end cases, built offline.

Every model has the one shape of :data:`TINY_SHAPE`; each family's config adds only what differs. Output heads
are scaled so next-token laws are peaked but not degenerate.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Final

import torch

#: Builds (target, draft) models on a device; the draft stands in for ``options["assistant_model"] = True``.
ModelFactory = Callable[[ModuleType, torch.device], tuple[Any, Any]]

#: Vocabulary of the sampling and greedy models, and of the drafting-head models.
E2E_VOCAB = 6
HEAD_VOCAB = 4
#: An end-of-sequence (and padding) id outside both vocabularies: generation never stops early (4.37 needs some
#: EOS) and no generated token is mistaken for padding.
UNREACHABLE_EOS = E2E_VOCAB
#: Output-head scale of the tiny models.
HEAD_SCALE = 12.0

#: The one shape of every tiny model: 16 wide, 2 attention heads of 8, a 32-wide MLP, 64 positions, token 0
#: begins and pads, output head untied from the embeddings.
TINY_SHAPE: Final[dict[str, Any]] = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "bos_token_id": 0,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
}


def tiny_config(config_class: Any, **fields: Any) -> Any:
    """``config_class`` built from :data:`TINY_SHAPE` with ``fields`` added or replaced."""
    return config_class(**{**TINY_SHAPE, **fields})


def scale_head(model: Any, scale: float = HEAD_SCALE) -> Any:
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    return model


def tiny_llama(
    transformers: ModuleType, device: torch.device, *, seed: int, layers: int, vocab: int = E2E_VOCAB, scale: float = HEAD_SCALE
) -> Any:
    torch.manual_seed(seed)
    config = tiny_config(transformers.LlamaConfig, vocab_size=vocab, num_hidden_layers=layers, eos_token_id=max(vocab, UNREACHABLE_EOS))
    return scale_head(transformers.LlamaForCausalLM(config).eval().to(device), scale)


def tiny_models(transformers: ModuleType, device: torch.device) -> tuple[Any, Any]:
    """A 2-layer target and a different 1-layer draft Llama over a 6-token vocabulary (seeded).

    The output heads are scaled so next-token laws are peaked but not degenerate.
    """

    return tiny_llama(transformers, device, seed=1, layers=2), tiny_llama(transformers, device, seed=2, layers=1)


def near_copy_models(
    transformers: ModuleType, device: torch.device, *, vocab: int = E2E_VOCAB, scale: float = HEAD_SCALE
) -> tuple[Any, Any]:
    """The tiny target and, as draft, a copy of it with seeded noise on the output head (scale 0.5 of the
    head's spread): greedy drafts agree with the target often but not always, so verifications accept all
    of several drafts as well as some of them (a free-standing random draft almost never agrees)."""
    target = tiny_llama(transformers, device, seed=1, layers=2, vocab=vocab, scale=scale)
    draft = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        head = draft.lm_head.weight
        head.add_(0.5 * head.std() * torch.randn(head.shape, generator=generator).to(head.device))
    return target, draft


#: Word-level vocabularies: the target's ids are the model's ids; the assistant's vocabulary shares
#: a, b, c, d, lacks e and adds x, y (so some drafts have no target token and are re-encoded).
_TARGET_WORDS = ("<u>", "a", "b", "c", "d", "e")


_ASSISTANT_WORDS = ("<u>", "a", "b", "c", "x", "y", "d")


def word_tokenizer(transformers: ModuleType, words: Sequence[str]) -> Any:
    """A whitespace word-level fast tokenizer built offline with the tokenizers library.

    ``get_vocab()`` lists the tokens in a fixed order (by the SHA-256 of each token), not in the order of
    the library's hash map, which changes from process to process: code that depends on that order
    (universal assisted generation's translator does) then behaves the same in every run, as the recorded
    seed promises. Like most real vocabularies', the order is not the id order.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: PLC0415 - optional

    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=words[0]))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=words[0], pad_token=words[0])
    unordered = tokenizer.get_vocab

    def get_vocab() -> dict[str, int]:
        vocab = unordered()
        return {token: vocab[token] for token in sorted(vocab, key=lambda t: hashlib.sha256(t.encode()).hexdigest())}

    tokenizer.get_vocab = get_vocab
    return tokenizer


def resolve_options(transformers: ModuleType, options: dict[str, Any], draft: Any, device: torch.device) -> dict[str, Any]:
    """generate() options with placeholders replaced by tiny models and tokenizers."""
    resolved = dict(options)
    if resolved.get("assistant_model") is True:
        resolved["assistant_model"] = draft
    elif resolved.get("assistant_model") == "other_vocabulary":
        resolved["assistant_model"] = tiny_llama(transformers, device, seed=3, layers=1, vocab=len(_ASSISTANT_WORDS))
        resolved["tokenizer"] = word_tokenizer(transformers, _TARGET_WORDS)
        resolved["assistant_tokenizer"] = word_tokenizer(transformers, _ASSISTANT_WORDS)
    return resolved


# ---------------------------------------------------------------------------------------------------
# The drafting heads' models (heads.py): a target family's own drafting modules over HEAD_VOCAB (multi-token
# prediction in mtp.py).


def dflash_models(transformers: ModuleType, device: torch.device) -> tuple[Any, Any]:
    """The tiny Llama target (2 layers) and a 1-layer DFlash drafter reading both layers' hidden states."""
    target = tiny_llama(transformers, device, seed=1, layers=2, vocab=HEAD_VOCAB)
    torch.manual_seed(13)
    config = tiny_config(
        transformers.MuseGlimmerAssistantConfig,
        num_hidden_layers=1,
        sliding_window=64,
        block_size=3,  # the anchor token and 2 drafts
        mask_token_id=HEAD_VOCAB - 1,  # a vocabulary id: its embedding marks the positions to draft
        target_layer_ids=[0, 1],
        eos_token_id=UNREACHABLE_EOS,
    )
    drafter = transformers.MuseGlimmerAssistantModel(config).eval().to(device)
    return target, drafter


def _gemma4_text_config(transformers: ModuleType) -> Any:
    return tiny_config(
        transformers.Gemma4TextConfig,
        vocab_size=HEAD_VOCAB,
        num_hidden_layers=2,
        num_key_value_heads=1,
        sliding_window=64,
        layer_types=["sliding_attention", "full_attention"],
        vocab_size_per_layer_input=0,
        hidden_size_per_layer_input=0,
        eos_token_id=UNREACHABLE_EOS,
    )


def gemma4_models(transformers: ModuleType, device: torch.device) -> tuple[Any, Any]:
    """A tiny 2-layer Gemma 4 text target and a 2-layer Gemma 4 assistant drafting 2 tokens per step."""
    torch.manual_seed(14)
    target = scale_head(transformers.Gemma4ForCausalLM(_gemma4_text_config(transformers)).eval()).to(device)
    torch.manual_seed(15)
    text = _gemma4_text_config(transformers)
    config = transformers.Gemma4AssistantConfig(
        text_config=text.to_dict(), backbone_hidden_size=TINY_SHAPE["hidden_size"], tie_word_embeddings=False
    )
    assistant = scale_head(transformers.Gemma4AssistantForCausalLM(config).eval()).to(device)
    assistant.generation_config.num_assistant_tokens = 2
    return target, assistant
