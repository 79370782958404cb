"""Processing semantics, the reference sampler's deterministic edge checks and output invariants."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specwatch.cases import CASES
from specwatch.experiments import ChainExperiment
from specwatch.protocol import Layer
from specwatch.sampling import Processing, SpecOutput, SpecStep, assemble, inverse_cdf, reference_sampler

N = 20_000


def _case_step(case_id: str) -> SpecStep:
    return next(c for c in CASES if c.id == case_id).step()


def _run(step: SpecStep, seed: int = 0) -> SpecOutput:
    return reference_sampler(step, N, torch.Generator().manual_seed(seed))


def test_top_k_keeps_ties_and_top_p_keeps_the_smallest_sufficient_set():
    logits = torch.tensor([[3.0, 1.0, 1.0, 0.0, -1.0]], dtype=torch.float64)
    kept = torch.isfinite(Processing(top_k=2).logits(logits))[0].tolist()
    assert kept == [True, True, True, False, False]
    probs = logits.softmax(-1)[0]  # about 0.77, 0.10, 0.10, 0.04, 0.01
    assert probs[0] < 0.9 < probs[:3].sum()
    kept_p = torch.isfinite(Processing(top_p=0.9).logits(logits))[0].tolist()
    assert kept_p == [True, True, True, False, False]
    assert torch.isfinite(Processing(top_p=0.5).logits(logits))[0].tolist() == [True, False, False, False, False]


def test_removed_mass_is_what_top_k_cuts_then_what_top_p_cuts_of_the_rest():
    logits = torch.tensor([3.0, 1.0, 1.0, 0.0, -1.0], dtype=torch.float64)
    probs = logits.softmax(-1)
    by_k, by_p = Processing(top_k=3, top_p=0.8).removed_mass(logits)
    assert by_k == pytest.approx(float(probs[3:].sum()))  # the two smallest tokens
    kept = probs[:3] / probs[:3].sum()  # about 0.79, 0.11, 0.11: top-p 0.8 keeps the first two
    assert by_p == pytest.approx(float(kept[2]))
    assert Processing(temperature=0.5).removed_mass(logits) == (0.0, 0.0)


def test_temperature_and_identity():
    logits = torch.tensor([[2.0, 0.0]], dtype=torch.float64)
    assert Processing(temperature=0.5).probs(logits)[0, 0] == pytest.approx(1 / (1 + np.exp(-4.0)))
    assert Processing().is_identity
    with pytest.raises(ValueError, match="temperature"):
        Processing(temperature=0.0)


def test_processing_does_not_mutate_its_input():
    logits = torch.randn(3, 10, dtype=torch.float64)
    before = logits.clone()
    Processing(temperature=0.7, top_k=3, top_p=0.8).probs(logits)
    assert torch.equal(logits, before)


def test_inverse_cdf_never_returns_a_zero_probability_token():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0], dtype=torch.float64)
    u = torch.tensor([0.0, 0.25, 0.5 - 1e-17, 0.5, 0.75, 1.0 - 2**-53], dtype=torch.float64)
    assert set(inverse_cdf(probs, u).tolist()) <= {1, 3}


def test_p_equals_q_accepts_every_draft():
    out = _run(_case_step("direct/p_equals_q/V64/g3"))
    assert bool((out.n_accepted == 3).all())


def test_disjoint_supports_reject_every_draft():
    step = _case_step("direct/disjoint/V8/g3")
    out = _run(step)
    assert bool((out.n_accepted == 0).all())
    assert bool((step.target_probs[0][out.tokens[:, 0]] > 0).all())


def test_q_zero_where_p_positive_is_never_drafted_but_is_emitted():
    step = _case_step("direct/q_zero_where_p/V64/g3")
    out = _run(step)
    q_zero = step.draft_probs[0] == 0
    assert not bool(q_zero[out.drafts[:, 0]].any())
    assert bool(q_zero[out.tokens[:, 0]].any()), "tokens only the residual can produce must appear"


def test_p_zero_where_q_positive_is_drafted_but_never_emitted():
    step = _case_step("direct/p_zero_where_q/V64/g3")
    out = _run(step)
    p_zero = step.target_probs[0] == 0
    assert bool(p_zero[out.drafts[:, 0]].any())
    assert not bool(p_zero[out.tokens[:, 0]].any())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_output_invariants_hold_for_the_reference(case):
    step = case.step()
    out = reference_sampler(step, 4096, torch.Generator().manual_seed(1))
    k, tokens, drafts = out.n_accepted, out.tokens, out.drafts
    cols = torch.arange(step.gamma + 1)
    emitted = cols <= k[:, None]
    assert tokens.shape == (4096, step.gamma + 1)
    assert bool(((tokens >= 0) & (tokens < step.vocab_size))[emitted].all())
    assert bool((tokens[~emitted] == -1).all())
    assert bool(((tokens[:, : step.gamma] == drafts) | (cols[: step.gamma] >= k[:, None])).all())
    obs = ChainExperiment(step, reference_sampler).run(4096, torch.Generator().manual_seed(1))
    assert obs.violations == ()


def _broken(kind: str):
    def sampler(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
        out = reference_sampler(step, n, generator)
        tokens = out.tokens.clone()
        if kind == "shape":
            return SpecOutput(out.drafts, tokens[:, :-1], out.n_accepted)
        if kind == "range":
            tokens[0, out.n_accepted[0]] = step.vocab_size
        elif kind == "padding":
            tokens[:, -1] = 0
            return SpecOutput(out.drafts, tokens, torch.zeros_like(out.n_accepted))
        elif kind == "prefix":
            shifted = assemble((out.drafts + 1) % step.vocab_size, torch.ones_like(out.n_accepted), tokens[:, 0].clamp(min=0))
            return SpecOutput(out.drafts, shifted.tokens, shifted.n_accepted)
        return SpecOutput(out.drafts, tokens, out.n_accepted)

    return sampler


@pytest.mark.parametrize(
    ("kind", "message"),
    [("shape", "shape"), ("range", "outside"), ("padding", "padding"), ("prefix", "differs from the draft")],
)
def test_malformed_outputs_are_certain_violations(kind, message):
    step = _case_step("direct/far_apart/V8/g3")
    obs = ChainExperiment(step, _broken(kind)).run(256, torch.Generator().manual_seed(0))
    assert any(v.layer == Layer.LOSSLESS and message in v.message for v in obs.violations)
