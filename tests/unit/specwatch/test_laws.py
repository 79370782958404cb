"""Exact laws: internal identities, and agreement with >= 1e5-trial Monte Carlo of the reference sampler."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from specwatch.cases import CASES
from specwatch.experiments import ChainExperiment
from specwatch.laws import ChainLaw, sequence_law, step_joint_cells, validate_law
from specwatch.mutants import MUTANTS
from specwatch.sampling import SpecStep, reference_sampler

DIRECT = [c for c in CASES if c.family == "direct"]


@pytest.mark.parametrize("case", DIRECT, ids=lambda c: c.id)
def test_law_identities(case):
    law = case.step().law
    # Losslessness of the formula: accepted mass plus excess is p at every draft position.
    np.testing.assert_allclose(law.accept_mass + law.excess, law.p[: law.gamma], atol=1e-15)
    assert law.k_law.sum() == pytest.approx(1.0)
    assert law.expected_accepted == pytest.approx(float(np.dot(np.arange(law.gamma + 1), law.k_law)))
    for t in range(law.gamma):
        joint = law.position_joint(t)
        assert joint.sum() == pytest.approx(1.0)
        np.testing.assert_allclose(joint[: law.vocab_size] + joint[law.vocab_size :], law.p[t], atol=1e-15)


def test_k_law_closed_form_constant_beta():
    """With constant beta, E[#emitted] = (1 - beta^(gamma+1)) / (1 - beta) (Leviathan et al. 2023)."""
    p = np.array([[0.5, 0.5, 0.0]] * 4)
    q = np.array([[0.25, 0.25, 0.5]] * 3)
    law = ChainLaw(p, q)
    beta = 0.5
    assert law.beta == pytest.approx([beta] * 3)
    assert 1 + law.expected_accepted == pytest.approx((1 - beta**4) / (1 - beta))


def test_equal_and_disjoint_rows_give_certain_k():
    p = np.array([[0.2, 0.8], [0.6, 0.4], [0.5, 0.5]])
    assert ChainLaw(p, p[:2]).k_law.tolist() == [0.0, 0.0, 1.0]
    disjoint = ChainLaw(np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([[0.0, 1.0]]))
    assert disjoint.k_law.tolist() == [1.0, 0.0]


def test_rejects_malformed_rows():
    with pytest.raises(ValueError, match="sum to 1"):
        ChainLaw(np.array([[0.5, 0.4], [0.5, 0.5]]), np.array([[0.5, 0.5]]))
    with pytest.raises(ValueError, match=r"\(gamma\+1, V\)"):
        ChainLaw(np.array([[0.5, 0.5]]), np.array([[0.5, 0.5]]))


def _gof_pvalue(counts: np.ndarray, law: np.ndarray) -> float:
    """Pearson p-value on cells with expected count >= 5, the rest pooled (valid at these counts)."""
    n = counts.sum()
    expected = n * law
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    if np.any((law == 0) & (counts > 0)):
        return 0.0
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.mark.parametrize(
    "case_id", ["direct/far_apart/V8/g3", "direct/close/V64/g5", "direct/processed_both/V64/g3", "direct/llm_like/V1024/g4"]
)
def test_exact_laws_match_monte_carlo(case_id):
    """2e5 trials of the reference sampler against K law, each emitted position and each (accept, token) law.

    Fixed seed; each p-value must exceed 1e-6 (Bonferroni over ~20 comparisons keeps this far from flaky).
    """
    case = next(c for c in CASES if c.id == case_id)
    step = case.step()
    law = step.law
    out = reference_sampler(step, 200_000, torch.Generator().manual_seed(7))
    k, tokens = out.n_accepted.numpy(), out.tokens.numpy()
    V = law.vocab_size
    assert _gof_pvalue(np.bincount(k, minlength=law.gamma + 1), law.k_law) > 1e-6
    for t in range(law.gamma + 1):
        emitted = tokens[k >= t, t]
        if len(emitted) >= 1000:
            assert _gof_pvalue(np.bincount(emitted, minlength=V), law.emitted(t)) > 1e-6, f"position {t + 1}"
    for t in range(law.gamma):
        reached = k >= t
        cells = tokens[reached, t] + V * (k[reached] == t)
        if reached.sum() >= 1000:
            assert _gof_pvalue(np.bincount(cells, minlength=2 * V), law.position_joint(t)) > 1e-6, f"joint {t + 1}"


def test_monte_carlo_would_catch_a_wrong_law():
    """The comparison above is not vacuous: the same data fail against a slightly wrong K law."""
    step = next(c for c in CASES if c.id == "direct/far_apart/V8/g3").step()
    out = reference_sampler(step, 200_000, torch.Generator().manual_seed(7))
    wrong = step.law.k_law.copy()
    wrong[0] -= 0.01
    wrong[1] += 0.01
    assert _gof_pvalue(np.bincount(out.n_accepted.numpy(), minlength=4), wrong) < 1e-6


def test_sequence_law_is_the_chain_rule():
    rng = np.random.default_rng(0)
    table = {(): rng.dirichlet(np.ones(3))}
    for a in range(3):
        table[(a,)] = rng.dirichlet(np.ones(3))
    law = sequence_law(lambda prefix: table[prefix], 2, 3)
    assert law.sum() == pytest.approx(1.0)
    for a in range(3):
        for b in range(3):
            assert law[3 * a + b] == pytest.approx(table[()][a] * table[(a,)][b])


def test_sequence_law_matches_monte_carlo_of_autoregressive_sampling():
    rng = np.random.default_rng(1)
    rows = {(): rng.dirichlet(np.full(4, 0.5))}
    for a in range(4):
        rows[(a,)] = rng.dirichlet(np.full(4, 0.5))
    law = sequence_law(lambda prefix: rows[prefix], 2, 4)
    sampler = np.random.default_rng(2)
    first = sampler.choice(4, size=100_000, p=rows[()])
    second = np.array([sampler.choice(4, p=rows[(int(a),)]) for a in first[:20_000]])
    counts = np.bincount(4 * first[:20_000] + second, minlength=16)
    assert _gof_pvalue(counts, law) > 1e-6


def test_spec_step_validates_shapes():
    with pytest.raises(ValueError, match="gamma"):
        SpecStep(torch.zeros(2, 4), torch.zeros(2, 4))


@pytest.mark.parametrize("case", [c for c in DIRECT if step_joint_cells(c.step().vocab_size, c.step().gamma) <= 50_000], ids=lambda c: c.id)
def test_step_joint_law_refines_the_k_law_and_the_positions(case):
    law = case.step().law
    joint = law.step_joint()
    V, gamma = law.vocab_size, law.gamma
    assert len(joint) == step_joint_cells(V, gamma)
    assert joint.sum() == pytest.approx(1.0)
    offset = 0
    first = np.zeros(V)
    for k in range(gamma + 1):
        block = joint[offset : offset + V ** (k + 1)].reshape((V,) * (k + 1))
        assert block.sum() == pytest.approx(law.k_law[k], abs=1e-12)
        first += block.reshape(V, -1).sum(axis=1)
        offset += V ** (k + 1)
    np.testing.assert_allclose(first, law.p[0], atol=1e-12)  # Y_1 ~ p_1 whatever K is


@pytest.mark.parametrize("case_id", ["direct/far_apart/V8/g3", "direct/transformers_target_distribution/V10/g3", "direct/far_apart/V8/g1"])
def test_step_joint_and_completed_laws_match_monte_carlo(case_id):
    """The exact joint laws of a step against 2e5 trials of the reference sampler (cells pooled below 5 expected),
    the completed step (positions after K + 1 drawn afresh from p_t) against prod_t p_t, and the counts the
    experiment makes of them."""
    case = next(c for c in CASES if c.id == case_id)
    step = case.step()
    experiment = ChainExperiment(step, reference_sampler)
    obs = experiment.run(200_000, torch.Generator().manual_seed(11))
    nulls = {c.name: c.null for c in experiment.checks}
    assert {"lossless/joint", "conformance/joint"} <= set(nulls)
    np.testing.assert_allclose(nulls["lossless/joint"], step.law.completed_joint())
    for name in ("lossless/joint", "conformance/joint"):
        assert _gof_pvalue(obs.counts[name], nulls[name]) > 1e-6, name


def test_the_joint_checks_catch_a_sampler_that_couples_its_positions():
    """One uniform for every draft: each position's law is right, the pairs are not."""
    case = next(c for c in CASES if c.id == "direct/p_equals_q/V64/g3")
    step = case.step()
    experiment = ChainExperiment(step, MUTANTS["shared_step_uniform"].sampler)
    obs = experiment.run(20_000, torch.Generator().manual_seed(3))
    nulls = {c.name: c.null for c in experiment.checks}
    for t in range(1, step.gamma + 2):
        assert _gof_pvalue(obs.counts[f"lossless/pos{t}"], nulls[f"lossless/pos{t}"]) > 1e-6
    assert "lossless/pair1" in nulls
    assert "lossless/joint" not in nulls
    pair = obs.counts["lossless/pair1"].reshape(64, 64)
    assert np.trace(pair) / pair.sum() > 1.5 * float(np.dot(step.law.p[0], step.law.p[1]))  # P(Y1 = Y2) 0.029, not 0.016
    assert _gof_pvalue(obs.counts["lossless/pair1"], nulls["lossless/pair1"]) < 1e-12


@pytest.mark.parametrize(
    ("law", "match"),
    [
        (np.array([np.nan, 1.0]), "law of x is not finite"),
        (np.array([0.5, 0.4]), "law of x sums to 0.9"),
        (np.array([1.5, -0.5]), "law of x has 1 negative cell"),
        (np.ones((2, 2)) / 4, "law of x must be a non-empty vector"),
    ],
)
def test_validate_law_names_what_is_wrong(law, match):
    with pytest.raises(ValueError, match=match):
        validate_law("x", law)
    np.testing.assert_array_equal(validate_law("x", np.array([0.25, 0.75])), [0.25, 0.75])


def test_sequence_law_refuses_an_oracle_row_that_is_not_a_law():
    with pytest.raises(ValueError, match=r"law of the next token after prefix \(1,\) is not finite"):
        sequence_law(lambda prefix: np.array([np.nan, 0.5]) if prefix == (1,) else np.array([0.5, 0.5]), 2, 2)
