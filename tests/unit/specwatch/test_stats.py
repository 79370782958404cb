"""Statistics against scipy references and their designed guarantees."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from scipy import stats

from specwatch.eprocess_power import eprocess_needed, load_table, tabulated_epsilons
from specwatch.stats import (
    KAPPA_GRID,
    PEARSON_FALLBACK_FACTOR,
    design_epsilon,
    detectable_epsilon,
    log_e_dirichlet_mixture,
    pearson_sample_size,
    pearson_statistic,
    plan_test,
    rejection_threshold,
    support_violations,
    trials_for_observations,
    tv_interval,
    weighted_chi2,
    weighted_chi2_pvalue,
)


@pytest.mark.parametrize(
    ("counts", "p0"),
    [
        ([3, 0, 5, 1], [0.1, 0.2, 0.3, 0.4]),
        ([0, 0, 40, 0], [0.25, 0.25, 0.25, 0.25]),
        ([10, 20, 30], [0.5, 0.3, 0.2]),
        ([1], [1.0]),
    ],
)
def test_e_process_is_the_dirichlet_multinomial_bayes_factor(counts, p0):
    """Per kappa: log DirMult(N; kappa p0) - log Mult(N; p0); the e-process is their mean over kappa."""
    counts, p0 = np.array(counts), np.array(p0)
    n = int(counts.sum())
    per_kappa = [
        stats.dirichlet_multinomial.logpmf(counts, kappa * p0, n) - stats.multinomial.logpmf(counts, n, p0) for kappa in KAPPA_GRID
    ]
    expected = float(np.log(np.mean(np.exp(per_kappa))))
    assert log_e_dirichlet_mixture(counts, p0) == pytest.approx(expected, rel=1e-7, abs=1e-7)  # lgamma cancellation at kappa = 2^26


def test_e_process_ignores_zero_probability_cells_and_starts_at_one():
    p0 = np.array([0.5, 0.5, 0.0])
    assert log_e_dirichlet_mixture(np.zeros(3, dtype=int), p0) == 0.0
    assert log_e_dirichlet_mixture(np.array([4, 6, 0]), p0) == pytest.approx(log_e_dirichlet_mixture(np.array([4, 6]), p0[:2]))
    assert support_violations(np.array([4, 6, 2]), p0) == 2


def test_e_process_is_a_martingale_under_the_null():
    """E[E_n] = 1 under H0: exact expectation over all outcomes of n = 3 draws from a 3-cell null."""
    p0 = np.array([0.2, 0.3, 0.5])
    total = 0.0
    for a in range(4):
        for b in range(4 - a):
            counts = np.array([a, b, 3 - a - b])
            total += math.exp(log_e_dirichlet_mixture(counts, p0)) * stats.multinomial.pmf(counts, 3, p0)
    assert total == pytest.approx(1.0, rel=1e-7)  # float64 lgamma cancellation at kappa = 2^26 costs ~1e-8


def test_e_process_grows_under_an_alternative():
    p0 = np.full(8, 1 / 8)
    rng = np.random.default_rng(0)
    alt = np.array([2, 2, 2, 2, 0, 0, 0, 0]) / 8 * 0.2 + p0 * 0.8
    assert log_e_dirichlet_mixture(rng.multinomial(20_000, alt), p0) > math.log(1e6)


@pytest.mark.parametrize(
    ("support", "epsilon", "expected"),
    # docs/statistics.md §7 (sample-size design), alpha = 1e-4, power 0.999 (Pearson, least-favourable alternative).
    [(8, 0.05, 6_571), (64, 0.05, 11_809), (1024, 0.05, 35_155), (64, 0.02, 73_805)],
)
def test_pearson_sample_size_matches_the_design_table(support, epsilon, expected):
    assert pearson_sample_size(support, epsilon, 1e-4, 1e-3) == pytest.approx(expected, rel=0.01)


def test_design_inverts_to_its_epsilon():
    n = pearson_sample_size(64, 0.03, 1e-5, 1e-3)
    assert detectable_epsilon(64, n, 1e-5, 1e-3) == pytest.approx(0.03, rel=1e-3)


def test_the_plan_reads_the_e_process_power_table_and_inverts_to_its_epsilon():
    design = plan_test(64, 0.25, 0.03, 1e-5, 1e-3)
    assert design.tabulated
    assert design.needed == eprocess_needed(64, 0.03, 1e5, 1e-3)
    assert design.trials() == pytest.approx(design.needed / 0.25)
    assert design_epsilon(64, design.needed, 1e-5, 1e-3) == 0.03
    assert design_epsilon(64, design.needed - 1, 1e-5, 1e-3) > 0.03
    # Never below what the table's largest epsilon needs, however few the observations.
    assert design_epsilon(64, 10, 1e-5, 1e-3) >= max(tabulated_epsilons())


def test_outside_the_table_the_plan_falls_back_to_twice_pearson_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="specwatch.stats"):
        design = plan_test(200_000, 1.0, 0.05, 1e-5, 1e-3)
    assert not design.tabulated
    assert design.needed == math.ceil(PEARSON_FALLBACK_FACTOR * pearson_sample_size(200_000, 0.05, 1e-5, 1e-3))
    assert "outside the e-process power table" in caplog.text
    assert design_epsilon(200_000, design.needed, 1e-5, 1e-3) == pytest.approx(0.05, rel=1e-3)


def test_the_fallback_factor_covers_every_row_of_the_table():
    """The fallback's factor is what the e-process needed over Pearson on every simulated row: a smaller factor fails."""
    table = load_table()
    ratios = [
        row["needed"] / pearson_sample_size(int(row["support"]), row["epsilon"], 1.0 / row["threshold"], 1e-3) for row in table["rows"]
    ]
    assert max(ratios) <= PEARSON_FALLBACK_FACTOR
    assert max(ratios) > 0.8 * PEARSON_FALLBACK_FACTOR


def _sequential_rejects(counts_stream: np.ndarray, p0: np.ndarray, log_threshold: float) -> bool:
    counts = np.zeros_like(p0, dtype=np.int64)
    for batch in counts_stream:
        counts += batch
        if log_e_dirichlet_mixture(counts, p0) >= log_threshold:
            return True
    return False


def _batches(rng: np.random.Generator, law: np.ndarray, total: int) -> np.ndarray:
    sizes, size, done = [], 1024, 0
    while done < total:
        sizes.append(min(size, total - done))
        done += sizes[-1]
        size = min(2 * size, 65536)
    return np.stack([rng.multinomial(s, law) for s in sizes])


def test_e_process_has_the_designed_power_at_the_planned_cap():
    """At TV = epsilon (Pearson's least-favourable, proportional alternative), the sequential test
    run to the planner's cap rejects in >= 99 % of 300 runs (designed: 99.9 %)."""
    alpha, beta, epsilon = 1e-4, 1e-3, 0.05
    p0 = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])
    order = np.argsort(-p0)
    sign = np.where(np.cumsum(p0[order]) <= 0.5 + 1e-12, 1.0, -1.0)
    head_mass = p0[order][sign > 0].sum()
    alt = p0.copy()
    alt[order] = p0[order] * np.where(sign > 0, 1 + epsilon / head_mass, 1 - epsilon / (1 - head_mass))
    assert 0.5 * np.abs(alt - p0).sum() == pytest.approx(epsilon)
    cap = plan_test(8, 1.0, epsilon, alpha, beta).needed
    rng = np.random.default_rng(11)
    misses = sum(not _sequential_rejects(_batches(rng, alt, cap), p0, math.log(1 / alpha)) for _ in range(300))
    assert misses <= 3


def test_bonferroni_threshold():
    assert rejection_threshold(1e-4, 50) == pytest.approx(5e5)
    with pytest.raises(ValueError, match="alpha"):
        rejection_threshold(0.0, 3)


def test_tv_interval_covers_the_truth():
    rng = np.random.default_rng(3)
    p0 = rng.dirichlet(np.ones(16))
    truth = rng.dirichlet(np.ones(16))
    true_tv = 0.5 * np.abs(truth - p0).sum()
    covered = 0
    for _ in range(200):
        _, lo, hi = tv_interval(rng.multinomial(5000, truth), p0)
        covered += lo <= true_tv <= hi
    assert covered >= 198


def test_weighted_chi2_expectation_under_the_null():
    """Multinomial: E[(N - n p)^2 - N] = n p (1 - p) - n p = -n p^2, so E[T] = -n sum p^(4/3)."""
    rng = np.random.default_rng(4)
    p0 = np.array([0.4, 0.3, 0.2, 0.1])
    counts = rng.multinomial(1000, p0, size=20_000)
    expected = -1000 * float(np.sum(p0 ** (4 / 3)))
    assert weighted_chi2(counts, p0).mean() == pytest.approx(expected, rel=0.05)


def test_monte_carlo_p_value_is_calibrated_and_pearson_matches_scipy():
    rng = np.random.default_rng(5)
    p0 = np.array([0.5, 0.25, 0.125, 0.125])
    pvalues = [weighted_chi2_pvalue(rng.multinomial(400, p0), p0, rng, draws=199) for _ in range(300)]
    assert np.mean(np.array(pvalues) <= 0.1) == pytest.approx(0.1, abs=0.06)
    counts = rng.multinomial(400, p0)
    assert pearson_statistic(counts, p0) == pytest.approx(stats.chisquare(counts, 400 * p0).statistic)


@pytest.mark.parametrize(("needed", "reach"), [(1_000, 1.0), (1_000, 0.5), (5_000, 0.03), (200, 0.001)])
def test_trials_for_observations_is_the_smallest_binomial_quantile(needed, reach):
    shortfall = 1e-3
    n = int(trials_for_observations(needed, reach, shortfall))
    assert stats.binom.cdf(needed - 1, n, reach) <= shortfall
    if reach < 1:
        assert stats.binom.cdf(needed - 1, n - 1, reach) > shortfall
        assert n > needed / reach  # more than the mean: the planned observations arrive w.p. 1 - shortfall
    assert trials_for_observations(needed, 10.0, shortfall) == math.ceil(needed / 10)  # ten observations in every trial
    assert trials_for_observations(needed, 0.0, shortfall) == math.inf
    assert trials_for_observations(needed, 1e-6, shortfall, limit=1 << 21) == 1 << 21
