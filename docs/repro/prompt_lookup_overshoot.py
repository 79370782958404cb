"""Prompt-lookup generation returns more than max_new_tokens tokens (docs/findings.md, 4.45.2).

Standalone: no specwatch code. With a release on the path (e.g. a scratch environment with torch and
``transformers==X``)::

    python docs/repro/prompt_lookup_overshoot.py [SEED]
    PATCH=1 python docs/repro/prompt_lookup_overshoot.py   # the candidate cap of the patch in findings.md

A tiny random Llama (6 tokens, peaked next-token laws, so greedy continuations soon repeat and prompt lookup
finds matches), 64 random prompts of 2–6 tokens, ``max_new_tokens=10``, 3 lookup tokens. For ``do_sample=False``
and ``do_sample=True`` it counts the calls that return more than 10 new tokens, and for greedy the calls
whose first 10 new tokens differ from plain greedy. It counts the ``get_candidates`` calls whose candidates end
past ``max_length`` and prints the first (accepted, they and the target's own token overshoot it; the patch
caps the candidates at ``max_length - 1 - input_length``).
"""

from __future__ import annotations

import os
import sys

import torch
import transformers
from transformers.generation import candidate_generator

VOCAB = 6
EOS = 6  # out of the vocabulary: generation never stops early
NEW = 10


def tiny_llama(seed: int) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=EOS,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(12.0)
    return model


def main(seed: int) -> None:
    print("transformers", transformers.__version__, "patched" if os.environ.get("PATCH") else "")
    generator_class = candidate_generator.PromptLookupCandidateGenerator
    original = generator_class.get_candidates
    overshooting: list[str] = []

    def recording(self, input_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not hasattr(self, "max_length"):  # 4.37.2 caps nothing: its generator does not know max_length
            return original(self, input_ids, *args, **kwargs)
        if os.environ.get("PATCH"):  # the patch: never more candidates than max_length - 1 - input_length
            room = self.max_length - 1 - input_ids.shape[1]
            saved = self.num_output_tokens
            self.num_output_tokens = max(1, min(saved, room))
            try:
                result = original(self, input_ids, *args, **kwargs)
            finally:
                self.num_output_tokens = saved
        else:
            result = original(self, input_ids, *args, **kwargs)
        candidates = result[0].shape[1] - input_ids.shape[1]
        if input_ids.shape[1] + candidates > self.max_length:
            overshooting.append(f"input length {input_ids.shape[1]}, max_length {self.max_length}, {candidates} candidates")
        return result

    generator_class.get_candidates = recording
    target = tiny_llama(1)
    base = {"max_new_tokens": NEW, "pad_token_id": EOS, "eos_token_id": EOS}
    lookup = {"prompt_lookup_num_tokens": 3}
    generator = torch.Generator().manual_seed(seed)
    long_greedy = long_sampled = different = 0
    example = None
    for _ in range(64):
        length = int(torch.randint(2, 7, (1,), generator=generator))
        ids = torch.randint(0, VOCAB, (1, length), generator=generator)
        mask = torch.ones_like(ids)
        with torch.no_grad():
            plain = target.generate(ids, attention_mask=mask, do_sample=False, **base)[0, length:].tolist()
            assisted = target.generate(ids, attention_mask=mask, do_sample=False, **base, **lookup)[0, length:].tolist()
            sampled = target.generate(ids, attention_mask=mask, do_sample=True, **base, **lookup)[0, length:].tolist()
        long_greedy += len(assisted) > NEW
        long_sampled += len(sampled) > NEW
        different += plain != assisted[:NEW]
        if example is None and len(assisted) > NEW:
            example = f"prompt {ids[0].tolist()}: plain {plain} ({len(plain)} new), prompt lookup {assisted} ({len(assisted)} new)"
    generator_class.get_candidates = original
    print(example or "no greedy call overshoots")
    print(f"do_sample=False: {long_greedy} of 64 calls return more than {NEW} new tokens; {different} differ in the first {NEW}")
    print(f"do_sample=True: {long_sampled} of 64 calls return more than {NEW} new tokens")
    print(f"get_candidates calls past max_length: {len(overshooting)}" + (f", first: {overshooting[0]}" if overshooting else ""))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
