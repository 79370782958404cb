"""The law a small-effect library mutant gives the conditional checks of ``e2e/prompt_lookup/processed``, from exact laws.

Prompt lookup verifies without a q: row i of a verification is sampled from the softmax of the target's logits as
the (mutated) processors returned them, and rows 0 .. num_matches are emitted (row i is emitted or not by rows < i
alone). So the law of every emitted token is known exactly: the row's own law. Over real ``generate()`` calls with
the mutant planted, this script records, for every emitted row, that law (``used``) and the exact processed law
``p`` (the suite's :class:`~specwatch.sampling.Processing` of the same raw logits), and prints, averaged over the
emitted rows (a Rao-Blackwellised figure: the law of each row is exact, only the paths are sampled):

* the mean TV between ``used`` and ``p`` per emitted token;
* the law of the 16 PIT bins the conditional checks count (by token id and by decreasing probability), against
  their null (uniform), as TV: the effect the checks' design TV is about.

    OMP_NUM_THREADS=1 .venv/bin/python bench/mutant_law.py [--mutant temperature_skipped_on_some_rows] [--calls 2000]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch

from specwatch.conditional import PIT_BINS, TokenOrder
from specwatch.targets.loader import resolve
from specwatch.targets.transformers.mutants import LIBRARY_MUTANTS

CASE = "e2e/prompt_lookup/processed"


def bin_law(p: np.ndarray, used: np.ndarray, order: TokenOrder) -> np.ndarray:
    """Law of the binned randomized PIT ``U = F_p(y) + W p(y)`` when ``y ~ used`` (exact: U is uniform on y's cell)."""
    vocab = np.arange(len(p))
    by_id = order is TokenOrder.ID
    low = np.cumsum(p) - p if by_id else np.array([p[(p > p[y]) | ((p == p[y]) & (vocab < y))].sum() for y in vocab])
    edges = np.arange(PIT_BINS + 1) / PIT_BINS
    out = np.zeros(PIT_BINS)
    for y in vocab:
        if used[y] <= 0 or p[y] <= 0:
            continue
        overlap = np.clip(np.minimum(edges[1:], low[y] + p[y]) - np.maximum(edges[:-1], low[y]), 0.0, None)
        out += used[y] * overlap / p[y]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mutant", default="temperature_skipped_on_some_rows")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    assert CASE in LIBRARY_MUTANTS[args.mutant].cases, f"{args.mutant} is not planted in {CASE}"
    target = resolve(f"transformers+mutant:{args.mutant}")
    experiment = next(c for c in target.cases if c.id == CASE).build(target.sampler, torch.device("cpu"))
    processing = experiment.processing

    import transformers.generation.candidate_generator as generators  # after the mutant is planted
    import transformers.generation.logits_process as logits_process

    rows: list[tuple[np.ndarray, np.ndarray]] = []  # (p, used) of the current verification's rows
    emitted: list[tuple[np.ndarray, np.ndarray]] = []
    mutated = logits_process.LogitsProcessorList.__call__
    strategy = generators.PromptLookupCandidateGenerator.update_candidate_strategy

    def record(self: Any, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        out: torch.Tensor = mutated(self, input_ids, scores, **kwargs)
        if scores.shape[0] == 1:
            p = processing.probs(scores[0].double()).numpy()
            rows.append((p, out[0].double().softmax(-1).numpy()))
        return out

    def verified(self: Any, input_ids: torch.Tensor, scores: torch.Tensor, num_matches: int) -> Any:
        emitted.extend(rows[-scores.shape[1] :][: int(num_matches) + 1])
        rows.clear()
        return strategy(self, input_ids, scores, num_matches)

    logits_process.LogitsProcessorList.__call__ = record
    generators.PromptLookupCandidateGenerator.update_candidate_strategy = verified
    kwargs = experiment.generation_kwargs()
    prompt = experiment.prompt
    torch.manual_seed(0)
    with torch.no_grad():
        for _ in range(args.calls):
            rows.clear()
            experiment.target.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs)
    tv = np.mean([0.5 * np.abs(used - p).sum() for p, used in emitted])
    laws = {o: np.mean([bin_law(p, used, o) for p, used in emitted], axis=0) for o in TokenOrder}
    print(f"{args.mutant} on {CASE}: {len(emitted)} emitted rows of {args.calls} calls (horizon {experiment.horizon})")
    print(f"  mean TV per emitted token (used vs exact processed law): {tv:.4f}")
    half = len(emitted) // 2
    for order, law in laws.items():
        halves = [np.mean([bin_law(p, used, order) for p, used in part], axis=0) for part in (emitted[:half], emitted[half:])]
        spread = ", ".join(f"{_tv(h):.4f}" for h in halves)
        print(f"  PIT bins by {order.value:4}: TV {_tv(law):.4f} from uniform (each half of the calls: {spread})")


def _tv(law: np.ndarray) -> float:
    return float(0.5 * np.abs(law - 1.0 / PIT_BINS).sum())


if __name__ == "__main__":
    main()
