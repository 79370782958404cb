"""DFlash on transformers 5.15.0: drafts sampled from processed scores, q reported from raw logits (docs/findings.md).

Standalone: no specwatch code. With a release on the path (torch and ``transformers==X``)::

    python docs/repro/dflash_5_15.py [N]        # drafted tokens vs reported q over N drafting calls (default 1000)
    PATCH=1 python docs/repro/dflash_5_15.py    # get_candidates returns the processed scores as q (5.15.1's fix)

The fixture: a tiny random ``LlamaForCausalLM`` target (4 tokens, 2 layers, output head scaled by 12) and a
1-layer random ``MuseGlimmerAssistantModel`` (the DFlash drafter class; block size 3: the anchor and 2 drafts)
reading the target's hidden states of both layers, as ``generate(assistant_model=..., speculation_type="dflash")``
uses them.

``generate(do_sample=True, temperature=1.6, top_k=3, top_p=0.65)`` on one prompt; every call of
``DFlashTokenCandidateGenerator.get_candidates`` that drafts is recorded: the first drafted token, the q the
sampler will use for it (the softmax of the returned candidate logits), and the law the draft is sampled from
(the softmax of what the logits processors returned for it, captured as they run). The drafted frequencies
follow the processed law, not the reported q.
"""

from __future__ import annotations

import os
import sys

import torch
import transformers
from transformers.generation import candidate_generator

VOCAB = 4
EOS = 6  # outside the vocabulary: generation never stops early
SHAPE = {
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
PROCESSING = {"temperature": 1.6, "top_k": 3, "top_p": 0.65}
Generator = candidate_generator.DFlashTokenCandidateGenerator


def models() -> tuple[transformers.PreTrainedModel, transformers.PreTrainedModel]:
    torch.manual_seed(1)
    config = transformers.LlamaConfig(**SHAPE, vocab_size=VOCAB, num_hidden_layers=2, eos_token_id=EOS)
    target = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(12.0)
    torch.manual_seed(13)
    drafter_config = transformers.MuseGlimmerAssistantConfig(
        **SHAPE,
        num_hidden_layers=1,
        sliding_window=64,
        block_size=3,
        mask_token_id=VOCAB - 1,
        target_layer_ids=[0, 1],
        eos_token_id=EOS,
    )
    return target, transformers.MuseGlimmerAssistantModel(drafter_config).eval()


def with_processed(get_candidates):  # type: ignore[no-untyped-def]
    """get_candidates, also returning the scores the logits processors produced, one per draft, in order."""

    def call(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        processors, processed = self.logits_processor, []
        if processors is not None:

            def recording(ids, scores):  # type: ignore[no-untyped-def]
                out = processors(ids, scores)
                processed.append(out.detach().clone())
                return out

            self.logits_processor = recording
        try:
            ids, logits = get_candidates(self, *args, **kwargs)
        finally:
            self.logits_processor = processors
        return ids, logits, processed

    return call


def patch_get_candidates() -> None:
    """5.15.1's fix, applied from outside: q is the processed scores each draft is sampled from."""
    original = with_processed(Generator.get_candidates)

    def get_candidates(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        ids, logits, processed = original(self, *args, **kwargs)
        if logits is None or not processed:
            return ids, logits
        return ids, torch.stack(processed, dim=1)

    Generator.get_candidates = get_candidates


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    print("transformers", transformers.__version__, "patched" if os.environ.get("PATCH") else "")
    if os.environ.get("PATCH"):
        patch_get_candidates()
    target, drafter = models()
    current = Generator.get_candidates
    recorder = with_processed(current)
    drafted, reported, processed = torch.zeros(VOCAB), torch.zeros(VOCAB), torch.zeros(VOCAB)
    recorded = 0

    def recording(self, input_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal recorded
        ids, logits, scores = recorder(self, input_ids, *args, **kwargs)
        if logits is not None and ids.shape[1] > input_ids.shape[1]:
            drafted[ids[0, input_ids.shape[1]]] += 1
            reported.add_(logits[0, 0].float().softmax(-1))
            processed.add_(scores[0][0].float().softmax(-1))
            recorded += 1
        return ids, logits

    Generator.get_candidates = recording
    prompt = torch.tensor([[1, 2, 3, 1, 2]])
    options = {"do_sample": True, "max_new_tokens": 6, "pad_token_id": EOS, "eos_token_id": EOS, **PROCESSING}
    torch.manual_seed(0)
    with torch.no_grad():
        while recorded < calls:
            target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=drafter, speculation_type="dflash", **options)
    Generator.get_candidates = current
    n = float(recorded)
    print(f"{recorded} drafting calls, first draft of each")
    print("reported q (mean):      ", [round(x, 3) for x in (reported / n).tolist()])
    print("processed law (mean):   ", [round(x, 3) for x in (processed / n).tolist()])
    print("drafted frequencies:    ", [round(x, 3) for x in (drafted / n).tolist()])
    tv_reported = 0.5 * (drafted / n - reported / n).abs().sum()
    tv_processed = 0.5 * (drafted / n - processed / n).abs().sum()
    print(f"TV(drafted, reported q) {tv_reported:.3f}, TV(drafted, processed law) {tv_processed:.3f}")


if __name__ == "__main__":
    main()
