"""llama-speculative (llama.cpp examples/speculative) at temperature > 0 is not lossless: standalone reproduction.

The example drafts the draft model's *most likely* token (``cur_p->data[0]`` after
``common_sampler_get_candidates(smpl, true)`` sorts the candidates by probability) but verifies it as if it had been
*sampled* from the draft's law q: accept when ``r <= p(d) / q(d)``, else draw from ``max(0, p - q)``. With a
deterministic draft d the emitted token's law at a drafted position is

    P(d) = min(1, p(d) / q(d)),   P(x != d) = (1 - min(1, p(d)/q(d))) * max(0, p(x) - q(x)) / Z,

which is p only when q is one-hot at d. This script writes two tiny random Llama models as GGUF (F32), runs
``llama-speculative`` N times with distinct seeds at temperature 1 (no other processing, ``--ignore-eos``), and
tallies the second generated token (the first position verified against a draft) after the most frequent first
token. It prints the observed frequencies beside p (the target's exact law, from a float64 forward of the same
weights) and beside the law above, with Pearson's chi-square p-value against each.

Usage (llama-cpp-python's vendored tree built with the llama-speculative target; transformers, gguf, scipy):

    python docs/repro/llama_speculative_argmax_draft.py PATH/TO/llama-speculative [N]

Fix (minimal patch to examples/speculative/speculative.cpp, drafting step): draft the token the draft sampler
*sampled*, not the top candidate, i.e. ``const llama_token id = cur_p->data[cur_p->selected].id;`` for the first
branch (``is == 0``). Then d ~ q and the ratio test with the residual is Leviathan/Chen sampling, lossless.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from scipy import stats

from specwatch.targets.llamacpp.chain import LlamaChain, speculative_example_law
from specwatch.targets.llamacpp.models import EOS, PIECES, next_token_logits, text, tiny_models, tokens_of

PROMPT = tokens_of("abcabcab")


def run(binary: str, models_dir: Path, seed: int) -> list[int]:
    cmd = [binary, "-m", str(models_dir / "target.gguf"), "-md", str(models_dir / "draft.gguf"), "-p", text(PROMPT), "-n", "10"]
    cmd += ["--spec-draft-n-max", "3", "-np", "1", "--seed", str(seed), "--ignore-eos", "-t", "1", "-c", "64"]
    cmd += ["--temp", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0", "-ctk", "f32", "-ctv", "f32", "-ctkd", "f32", "-ctvd", "f32"]
    for _ in range(30):  # the tool's log thread can drop the tail of its print at exit: a seed gives the same tokens
        with tempfile.TemporaryFile("w+") as out:
            subprocess.run(cmd, stdout=out, stderr=subprocess.DEVNULL, check=True)
            out.seek(0)
            body = out.read().strip().removeprefix(text(PROMPT))
        if len(body) >= 2:
            return [PIECES.index(c) for c in body[:2]]
    raise RuntimeError(f"llama-speculative printed {body!r} for seed {seed}")


def main() -> int:
    binary = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    models = tiny_models()
    pairs = [run(binary, models.root, seed) for seed in range(1, n + 1)]
    first = Counter(a for a, _ in pairs).most_common(1)[0][0]
    second = np.bincount([b for a, b in pairs if a == first], minlength=len(PIECES))
    chain = LlamaChain(banned=(EOS,))
    p = chain.probs(next_token_logits(PROMPT, [first]))
    q = chain.probs(next_token_logits(PROMPT, [first], model="draft"))
    mechanism = speculative_example_law(p, q)
    total = int(second.sum())
    print(f"{n} runs; first token {PIECES[first]!r} in {total}; draft's top candidate next: {PIECES[int(np.argmax(q))]!r}")
    print("token  observed  target p  mechanism")
    for t in range(len(PIECES)):
        print(f"{PIECES[t]:>5}  {second[t] / total:8.4f}  {p[t]:8.4f}  {mechanism[t]:9.4f}")
    for name, law in (("target p", p), ("mechanism", mechanism)):
        support = law > 0
        outside = int(second[~support].sum())
        chi = stats.chisquare(second[support], law[support] * total)
        print(
            f"against {name}: chi-square p-value {chi.pvalue:.3g}, {outside} draws outside its support, TV {0.5 * np.abs(second / total - law).sum():.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
