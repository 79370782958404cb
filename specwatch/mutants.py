"""Mutant catalogue: realistic buggy speculative samplers with the reference's interface.

Each mutant reproduces a realistic bug class (docs/statistics.md §11; with its public source where
one exists). The suite must fail every mutant that is not lossless by design, and must fail the
lossless-but-slower ones on conformance only. They are positive controls for the suite itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specwatch.sampling import (
    Processing,
    Sampler,
    SpecOutput,
    SpecStep,
    accepted_prefix,
    assemble,
    at,
    normalise_rows,
    sample_by_row_index,
    sample_rows,
    uniforms,
)


@dataclass(frozen=True)
class Mutant:
    name: str
    description: str
    lossless: bool
    sampler: Sampler


def _verify(
    step: SpecStep,
    n: int,
    generator: torch.Generator,
    *,
    drafts: torch.Tensor | None = None,
    ratio_p: torch.Tensor | None = None,
    ratio_q: torch.Tensor | None = None,
    residual_rows: torch.Tensor | None = None,
    bonus_row: torch.Tensor | None = None,
    relax: float = 1.0,
    accept_ties: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Speculative sampling with pieces swapped in; returns drafts, accept bits, final rows, uniforms."""
    p, q, gamma, device = step.target_probs, step.draft_probs, step.gamma, step.device
    if drafts is None:
        drafts = sample_rows(q, uniforms(n, gamma, generator, device))
    rp = p[:gamma] if ratio_p is None else ratio_p
    rq = q if ratio_q is None else ratio_q
    u = uniforms(n, gamma, generator, device)
    ratio = at(rp, drafts) / at(rq, drafts)
    accept = u * relax <= ratio if accept_ties else u * relax < ratio
    residual = normalise_rows((p[:gamma] - rq).clamp(min=0)) if residual_rows is None else residual_rows
    bonus = p[gamma:] if bonus_row is None else bonus_row
    return drafts, accept, torch.cat((residual, bonus), dim=0), u


def _finish(drafts: torch.Tensor, accept: torch.Tensor, rows: torch.Tensor, generator: torch.Generator) -> SpecOutput:
    k = accepted_prefix(accept)
    final = sample_by_row_index(rows, k, uniforms(len(k), 1, generator, drafts.device)[:, 0])
    return assemble(drafts, k, final)


def swapped_residual(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    rows = normalise_rows((step.draft_probs - step.target_probs[: step.gamma]).clamp(min=0))
    return _finish(*_verify(step, n, generator, residual_rows=rows)[:3], generator)


def unnormalised_residual_cdf(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    drafts, accept, rows, _ = _verify(step, n, generator)
    excess = (step.target_probs[: step.gamma] - step.draft_probs).clamp(min=0)
    k = accepted_prefix(accept)
    u = uniforms(n, 1, generator, step.device)[:, 0]
    final = sample_by_row_index(rows, k, u)
    for r in range(step.gamma):  # inverse CDF of the unnormalised residual: overflow lands on the last id
        sel = k == r
        cdf = excess[r].cumsum(dim=0)
        final[sel] = torch.searchsorted(cdf, u[sel], right=True).clamp(max=step.vocab_size - 1)
    return assemble(drafts, k, final)


def _raw(logits: torch.Tensor) -> torch.Tensor:
    return logits.double().softmax(dim=-1)


def topk_draft_raw_ratio(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """Draft sampled from processed q, but raw (unprocessed) q reported for the ratio (HF #47932)."""
    return _finish(*_verify(step, n, generator, ratio_q=_raw(step.draft_logits))[:3], generator)


def raw_draft_topk_ratio(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """Draft sampled from raw q, processed q in the ratio (x / 0 = inf: always accepted)."""
    drafts = sample_rows(_raw(step.draft_logits), uniforms(n, step.gamma, generator, step.device))
    return _finish(*_verify(step, n, generator, drafts=drafts)[:3], generator)


def greedy_draft_soft_q(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """Assistant drafts greedily while its softmax is used as q (HF #32867)."""
    drafts = step.draft_probs.argmax(dim=-1).expand(n, -1).contiguous()
    return _finish(*_verify(step, n, generator, drafts=drafts)[:3], generator)


def temperature_one_side(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """Draft sampled at its temperature, q in the ratio computed at temperature 1."""
    proc = step.draft_processing
    q1 = Processing(temperature=1.0, top_k=proc.top_k, top_p=proc.top_p).probs(step.draft_logits.double())
    return _finish(*_verify(step, n, generator, ratio_q=q1)[:3], generator)


def untempered_target(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """Target processing (temperature, top-k, top-p) not applied: lossless for the wrong target."""
    p_raw = _raw(step.target_logits)
    rows = normalise_rows((p_raw[: step.gamma] - step.draft_probs).clamp(min=0))
    return _finish(
        *_verify(step, n, generator, ratio_p=p_raw[: step.gamma], residual_rows=rows, bonus_row=p_raw[step.gamma :])[:3], generator
    )


def residual_next_position(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    rows = normalise_rows((step.target_probs[1:] - step.draft_probs).clamp(min=0))
    return _finish(*_verify(step, n, generator, residual_rows=rows)[:3], generator)


def bonus_from_last_draft_position(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    bonus = step.target_probs[step.gamma - 1 : step.gamma]
    return _finish(*_verify(step, n, generator, bonus_row=bonus)[:3], generator)


def q_index_shifted(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """q of the next draft position used in the ratio and residual (the last one keeps its own)."""
    idx = torch.clamp(torch.arange(step.gamma, device=step.device) + 1, max=step.gamma - 1)
    return _finish(*_verify(step, n, generator, ratio_q=step.draft_probs[idx])[:3], generator)


def reused_uniform(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """The acceptance uniform of the rejected position is reused to draw the residual."""
    drafts, accept, rows, u = _verify(step, n, generator)
    k = accepted_prefix(accept)
    fresh = uniforms(n, 1, generator, step.device)[:, 0]
    reuse = torch.cat((u, fresh[:, None]), dim=1).gather(1, k[:, None])[:, 0]
    return assemble(drafts, k, sample_by_row_index(rows, k, reuse))


def shared_step_uniform(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """One uniform draws every draft of a step (positions coupled); each marginal is still q_i, so only a
    check of the step's joint law sees it."""
    shared = uniforms(n, 1, generator, step.device).expand(n, step.gamma)
    drafts = sample_rows(step.draft_probs, shared)
    return _finish(*_verify(step, n, generator, drafts=drafts)[:3], generator)


def relaxed_acceptance(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """Accept while u < ratio / 0.9 (a relaxed threshold, SGLang threshold_acc < 1)."""
    return _finish(*_verify(step, n, generator, relax=0.9)[:3], generator)


def accept_on_tie(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """Accept while u <= ratio: a draft with p = 0 is accepted when u == 0 (transformers' comparison)."""
    return _finish(*_verify(step, n, generator, accept_ties=True)[:3], generator)


def n_accepted_sum_of_bits(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """n_accepted counts every accepted bit, not the accepted prefix."""
    drafts, accept, rows, _ = _verify(step, n, generator)
    k = accept.long().sum(dim=1)
    final = sample_by_row_index(rows, k, uniforms(n, 1, generator, step.device)[:, 0])
    return assemble(drafts, k, final)


def rejected_draft_emitted(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """The first rejected draft is emitted too (n_matches + 1), then the residual token."""
    drafts, accept, rows, _ = _verify(step, n, generator)
    k = accepted_prefix(accept)
    final = sample_by_row_index(rows, k, uniforms(n, 1, generator, step.device)[:, 0])
    shown = torch.clamp(k + 1, max=step.gamma)
    return assemble(drafts, shown, final)


def target_topk_residual_only(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """Target processing applied to the residual and bonus only; acceptance uses raw p (vLLM #10198 class)."""
    p_raw = _raw(step.target_logits)
    return _finish(*_verify(step, n, generator, ratio_p=p_raw[: step.gamma])[:3], generator)


def residual_ignores_q(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """Residual = p with the rejected draft zeroed, q ignored (a no-draft-probs path used with real q)."""
    drafts, accept, _, _ = _verify(step, n, generator)
    p, gamma = step.target_probs, step.gamma
    k = accepted_prefix(accept)
    final = sample_by_row_index(p, k, uniforms(n, 1, generator, step.device)[:, 0])
    redo = k < gamma
    rejected = drafts.gather(1, k.clamp(max=gamma - 1)[:, None])[:, 0]
    while bool((pending := redo & (final == rejected)).any()):  # rejection sampling = p without the draft
        final[pending] = sample_by_row_index(p, k[pending], uniforms(int(pending.sum()), 1, generator, step.device)[:, 0])
    return assemble(drafts, k, final)


def first_draft_unverified(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    drafts, accept, rows, _ = _verify(step, n, generator)
    accept[:, 0] = True
    return _finish(drafts, accept, rows, generator)


def strict_acceptance(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """Accept a draft only if it equals an independent target sample; lossless but slower."""
    p, q, gamma, device = step.target_probs, step.draft_probs, step.gamma, step.device
    drafts = sample_rows(q, uniforms(n, gamma, generator, device))
    own = sample_rows(p, uniforms(n, gamma + 1, generator, device))
    accept = drafts == own[:, :gamma]
    k = accepted_prefix(accept)
    return assemble(drafts, k, own.gather(1, k[:, None])[:, 0])


def greedy_onehot_draft(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """Greedy drafts verified against a one-hot q: lossless, but acceptance drops to p(argmax q)."""
    q_onehot = torch.nn.functional.one_hot(step.draft_probs.argmax(dim=-1), step.vocab_size).double()
    drafts = step.draft_probs.argmax(dim=-1).expand(n, -1).contiguous()
    return _finish(*_verify(step, n, generator, drafts=drafts, ratio_q=q_onehot)[:3], generator)


def _mutant(fn: Sampler, lossless: bool = False) -> Mutant:
    name: str = getattr(fn, "__name__")  # noqa: B009 - a Sampler is any callable; these are functions
    doc = (fn.__doc__ or name.replace("_", " ")).strip().splitlines()[0]
    return Mutant(name=name, description=doc, lossless=lossless, sampler=fn)


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        _mutant(swapped_residual),
        _mutant(unnormalised_residual_cdf),
        _mutant(topk_draft_raw_ratio),
        _mutant(raw_draft_topk_ratio),
        _mutant(greedy_draft_soft_q),
        _mutant(temperature_one_side),
        _mutant(untempered_target),
        _mutant(residual_next_position),
        _mutant(bonus_from_last_draft_position),
        _mutant(q_index_shifted),
        _mutant(reused_uniform),
        _mutant(shared_step_uniform),
        _mutant(relaxed_acceptance),
        _mutant(accept_on_tie),
        _mutant(n_accepted_sum_of_bits),
        _mutant(rejected_draft_emitted),
        _mutant(target_topk_residual_only),
        _mutant(residual_ignores_q),
        _mutant(first_draft_unverified),
        _mutant(strict_acceptance, lossless=True),
        _mutant(greedy_onehot_draft, lossless=True),
    )
}
