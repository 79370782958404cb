# The toy library's sampler, correct. scripts/demo.py and the tests (tests/support/toy_target.py) commit this
# file as src/toy_lib/sampler.py of a toy git repository, and derive the buggy variants from it.
"""Speculative sampling (Leviathan et al. 2023), vectorised over trials."""

import torch

from specwatch import SpecOutput


def _draw(probs, u):
    cdf = probs.cumsum(-1)
    idx = torch.searchsorted(cdf, (u * cdf[-1]).contiguous(), right=True)
    return idx.clamp(max=int(torch.nonzero(probs > 0).max()))


def _residual(p, q):
    return (p - q).clamp(min=0)


def speculative_sample(step, n, generator):
    p, q = step.target_probs, step.draft_probs
    gamma, device = q.shape[0], p.device
    u = torch.rand((n, gamma), generator=generator, dtype=torch.float64, device=device)
    drafts = torch.stack([_draw(q[i], u[:, i]) for i in range(gamma)], dim=1)
    ratio = p[:gamma].gather(1, drafts.T).T / q.gather(1, drafts.T).T
    accept = torch.rand((n, gamma), generator=generator, dtype=torch.float64, device=device) < ratio
    n_accepted = accept.long().cumprod(dim=1).sum(dim=1)
    rows = torch.cat((_residual(p[:gamma], q), p[gamma:]), dim=0)
    u_final = torch.rand((n,), generator=generator, dtype=torch.float64, device=device)
    final = torch.empty_like(n_accepted)
    for r in torch.unique(n_accepted).tolist():
        sel = n_accepted == r
        final[sel] = _draw(rows[r], u_final[sel])
    padded = torch.cat((drafts, torch.full((n, 1), -1, dtype=drafts.dtype, device=device)), dim=1)
    cols = torch.arange(gamma + 1, device=device)
    tokens = torch.where(cols < n_accepted[:, None], padded, torch.full_like(padded, -1))
    tokens[torch.arange(n, device=device), n_accepted] = final
    return SpecOutput(drafts=drafts, tokens=tokens, n_accepted=n_accepted)
