"""Assisted greedy decoding vs plain greedy decoding on a tiny random Llama (docs/findings.md, 4.40.2).

Standalone: no specwatch code. In a scratch environment::

    python3 -m venv /tmp/tf440 && /tmp/tf440/bin/pip install torch==2.13.0 transformers==4.40.2
    /tmp/tf440/bin/python docs/repro/assisted_greedy_4_40_2.py [SEED]
    /tmp/tf440/bin/python docs/repro/assisted_greedy_4_40_2.py sampled [N]   # needs numpy and scipy too

On 4.40.2 the fixed prompts differ (both with an assistant model, the second with prompt lookup), and so
do some of the 64 random prompts (seed 0: 6 with an assistant model, 4 with prompt lookup); on 4.41.2
and 4.44.2 none does. ``ATTN=eager`` selects eager attention.
"""

from __future__ import annotations

import os
import sys

import torch
import transformers

VOCAB = 6
EOS = 6  # out of the vocabulary: generation never stops early


def tiny_llama(seed: int, layers: int) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    extra = {"attn_implementation": os.environ["ATTN"]} if "ATTN" in os.environ else {}
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=EOS,
        pad_token_id=0,
        tie_word_embeddings=False,
        **extra,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(12.0)  # peaked next-token laws, as in the suite's tiny models
    return model


def main() -> None:
    print("transformers", transformers.__version__)
    target, draft = tiny_llama(1, 2), tiny_llama(2, 1)
    base = {"do_sample": False, "max_new_tokens": 6, "pad_token_id": EOS, "eos_token_id": EOS}
    modes = {"assistant": {"assistant_model": draft}, "lookup": {"prompt_lookup_num_tokens": 2}}

    def new_tokens(prompt: list[int], options: dict[str, object]) -> tuple[list[int], list[int]]:
        ids = torch.tensor([prompt])
        mask = torch.ones_like(ids)
        with torch.no_grad():
            plain = target.generate(ids, attention_mask=mask, **base)
            assisted = target.generate(ids, attention_mask=mask, **base, **options)
        return plain[0, len(prompt) :].tolist(), assisted[0, len(prompt) :].tolist()

    for prompt in ([2, 4, 5, 4, 1, 4], [4, 5, 1, 2, 4]):
        for name, options in modes.items():
            plain, assisted = new_tokens(prompt, options)
            print(prompt, name, "plain", plain, "assisted", assisted, "same" if plain == assisted else "DIFFERENT")
    generator = torch.Generator().manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    for name, options in modes.items():
        different = 0
        for _ in range(64):
            length = int(torch.randint(2, 7, (1,), generator=generator))
            prompt = torch.randint(0, VOCAB, (length,), generator=generator).tolist()
            plain, assisted = new_tokens(prompt, options)
            different += plain != assisted
        print(f"{name}: {different} of 64 random prompts differ")


def sampled(n: int) -> None:
    """``do_sample=True``: the law of each of the first 4 new tokens, plain vs assisted, n draws each."""
    import numpy as np
    from scipy.stats import chi2_contingency

    print("transformers", transformers.__version__)
    target, draft = tiny_llama(1, 2), tiny_llama(2, 1)
    prompt = torch.tensor([[2, 4, 5, 4, 1, 4]])
    mask = torch.ones_like(prompt)
    base = {"do_sample": True, "max_new_tokens": 4, "pad_token_id": EOS, "eos_token_id": EOS}

    def draw(options: dict[str, object], seed: int) -> np.ndarray:
        torch.manual_seed(seed)
        rows = []
        for _ in range(n):
            with torch.no_grad():
                out = target.generate(prompt, attention_mask=mask, **base, **options)
            rows.append(out[0, prompt.shape[1] :].tolist())
        return np.array(rows)

    plain, assisted = draw({}, 1), draw({"assistant_model": draft}, 2)
    for t in range(4):
        a, b = np.bincount(plain[:, t], minlength=VOCAB), np.bincount(assisted[:, t], minlength=VOCAB)
        seen = (a + b) > 0
        p_value = chi2_contingency(np.stack([a[seen], b[seen]]))[1]
        print(f"token {t + 1}: plain {a.tolist()} assisted {b.tolist()} TV {0.5 * np.abs(a - b).sum() / n:.3f} p {p_value:.2g}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "sampled":
        sampled(int(sys.argv[2]) if len(sys.argv) > 2 else 3000)
    else:
        main()
