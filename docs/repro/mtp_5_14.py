"""Multi-token prediction on transformers 5.14-5.15: q is the raw logits; Inkling raises on short prompts (docs/findings.md).

Standalone: no specwatch code. With a release on the path (torch, safetensors and ``transformers==X``)::

    python docs/repro/mtp_5_14.py q [N]        # drafted tokens vs reported q over N drafting calls (default 1000)
    python docs/repro/mtp_5_14.py greedy       # plain and use_mtp=True greedy generate() on 64 random prompts
    PATCH=1 python docs/repro/mtp_5_14.py q    # MtpModel.forward returns the processed scores as q (5.15.1's fix)

The fixture: a tiny random ``InklingForCausalLM`` (4 tokens, 2 decoder layers, peaked head) whose local
checkpoint carries 2 MTP layers (``model.mtp.layers.k``, seeded random ``MtpModel`` weights), loaded back with
``from_pretrained`` so that ``generate(use_mtp=True)`` finds them, as it finds a real checkpoint's.

``q``: ``generate(do_sample=True, temperature=0.7, top_k=3, use_mtp=True)`` on one prompt; every call of
``MtpModel.forward`` after the prefill is recorded: the first drafted token, and the q the sampler will use
for it (the softmax of the returned candidate logits), against the law the draft is sampled from (the softmax
of the processed scores, recomputed from the same logits). The drafted frequencies follow the processed law,
not the reported q.

``greedy``: counts the prompts (2-6 tokens) on which plain greedy ``generate()`` and ``generate(use_mtp=True)``
raise, with their prompt lengths, and the prompts where both run and differ; prints the first error of each.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import modeling_layers

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


def inkling_with_mtp(folder: str) -> transformers.PreTrainedModel:
    config = transformers.InklingTextConfig(
        **SHAPE,
        vocab_size=VOCAB,
        num_hidden_layers=2,
        num_mtp_layers=2,
        eos_token_id=EOS,
        swa_num_attention_heads=2,
        swa_num_key_value_heads=2,
        swa_head_dim=8,
        sliding_window_size=64,
        d_rel=4,
        rel_extent=64,
        mlp_layer_types=["dense"] * 2,
        logits_mup_width_multiplier=1.0,
    )
    torch.manual_seed(16)
    main = transformers.InklingForCausalLM(config).eval()
    with torch.no_grad():
        main.get_output_embeddings().weight.mul_(12.0)
    torch.manual_seed(17)
    mtp = modeling_layers.MtpModel(main, 2)
    with torch.no_grad():  # MtpModel.post_init leaves Inkling's own parameter types uninitialised
        for name, child in mtp.named_children():
            if name not in ("embed_tokens", "shared_head", "rotary_emb"):
                for module in child.modules():
                    main._init_weights(module)
    shared = ("embed_tokens.", "shared_head.", "rotary_emb.")
    weights = {f"model.mtp.{k}": v.detach().clone() for k, v in mtp.state_dict().items() if not k.startswith(shared)}
    main.save_pretrained(folder)
    path = Path(folder) / "model.safetensors"
    save_file({**load_file(str(path)), **weights}, str(path), metadata={"format": "pt"})
    return transformers.InklingForCausalLM.from_pretrained(folder).eval()


def patch_forward() -> None:
    """5.15.1's fix, applied from outside: q is the processed scores the draft is sampled from."""
    original = modeling_layers.MtpModel.forward

    def forward(self, *args, logits_processor=None, full_input_ids=None, **kwargs):  # type: ignore[no-untyped-def]
        ids, logits, loss = original(self, *args, logits_processor=logits_processor, full_input_ids=full_input_ids, **kwargs)
        if logits_processor is None or full_input_ids is None:
            return ids, logits, loss
        scores = []
        for i in range(logits.shape[1]):  # layer i's processors saw the full ids plus the i earlier drafts
            seen = torch.cat([full_input_ids, ids[:, :i]], dim=-1)
            scores.append(logits_processor(seen, logits[:, i].float()))
        return ids, torch.stack(scores, dim=1), loss

    modeling_layers.MtpModel.forward = forward


def q_experiment(target: transformers.PreTrainedModel, calls: int) -> None:
    original = modeling_layers.MtpModel.forward
    drafted, reported, processed = torch.zeros(VOCAB), torch.zeros(VOCAB), torch.zeros(VOCAB)
    recorded = 0

    def recording(self, *args, logits_processor=None, full_input_ids=None, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal recorded
        ids, logits, loss = original(self, *args, logits_processor=logits_processor, full_input_ids=full_input_ids, **kwargs)
        drafted[ids[0, 0]] += 1
        q = logits[0, 0].float().softmax(-1)
        reported.add_(q)
        # the law the draft was sampled from: the processed scores (patched, those are what forward returned)
        law = q if os.environ.get("PATCH") else logits_processor(full_input_ids, logits[0, 0:1].float()).softmax(-1)[0]
        processed.add_(law)
        recorded += 1
        return ids, logits, loss

    modeling_layers.MtpModel.forward = recording
    prompt = torch.tensor([[0, 2, 1]])
    options = {"do_sample": True, "temperature": 0.7, "top_k": 3, "max_new_tokens": 4, "pad_token_id": EOS, "eos_token_id": EOS}
    torch.manual_seed(0)
    with torch.no_grad():
        while recorded < calls:
            target.generate(prompt, attention_mask=torch.ones_like(prompt), use_mtp=True, **options)
    modeling_layers.MtpModel.forward = original
    n = float(recorded)
    print(f"{recorded} drafting calls, first draft of each")
    print("reported q (mean):      ", [round(x, 3) for x in (reported / n).tolist()])
    print("processed law (mean):   ", [round(x, 3) for x in (processed / n).tolist()])
    print("drafted frequencies:    ", [round(x, 3) for x in (drafted / n).tolist()])
    tv_reported = 0.5 * (drafted / n - reported / n).abs().sum()
    tv_processed = 0.5 * (drafted / n - processed / n).abs().sum()
    print(f"TV(drafted, reported q) {tv_reported:.3f}, TV(drafted, processed law) {tv_processed:.3f}")


def greedy_experiment(target: transformers.PreTrainedModel) -> None:
    base = {"do_sample": False, "max_new_tokens": 10, "pad_token_id": EOS, "eos_token_id": EOS}
    generator = torch.Generator().manual_seed(0)
    raised: dict[str, list[int]] = {"plain": [], "use_mtp": []}  # prompt lengths of the calls that raise
    different = 0
    first: dict[str, tuple[list[int], BaseException]] = {}
    for _ in range(64):
        length = int(torch.randint(2, 7, (1,), generator=generator))
        ids = torch.randint(0, VOCAB, (1, length), generator=generator)
        mask = torch.ones_like(ids)
        outputs = {}
        for name, extra in (("plain", {}), ("use_mtp", {"use_mtp": True})):
            try:
                with torch.no_grad():
                    outputs[name] = target.generate(ids, attention_mask=mask, **base, **extra)
            except RuntimeError as exc:
                raised[name].append(length)
                first.setdefault(name, (ids[0].tolist(), exc))
        if len(outputs) == 2:
            different += not torch.equal(outputs["plain"], outputs["use_mtp"])
    for name, lengths in raised.items():
        print(f"greedy {name}: {len(lengths)} of 64 prompts raise (prompt lengths {sorted(set(lengths))})")
    print(f"{different} of the prompts where both ran differ")
    for name, (prompt, exc) in first.items():
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"first {name}: prompt {prompt}: {type(exc).__name__}: {exc} ({Path(frame.filename).name}:{frame.lineno})")


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "q"
    print("transformers", transformers.__version__, "patched" if os.environ.get("PATCH") else "")
    transformers.utils.logging.disable_progress_bar()  # MtpModel.from_pretrained runs in every generate() call
    if os.environ.get("PATCH"):
        patch_forward()
    with tempfile.TemporaryDirectory() as folder:
        target = inkling_with_mtp(folder)
        if mode == "greedy":
            greedy_experiment(target)
        else:
            q_experiment(target, int(sys.argv[2]) if len(sys.argv) > 2 else 1000)


if __name__ == "__main__":
    main()
