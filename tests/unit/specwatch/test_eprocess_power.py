"""The shipped e-process power table: conservative lookup, and the miss rate it claims re-measured with fresh seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specwatch.eprocess_power import eprocess_needed, load_table
from specwatch.stats import count_misses, least_favourable


def _row(support: int, epsilon: float, threshold: float) -> int:
    for r in load_table()["rows"]:
        if (r["support"], r["epsilon"], r["threshold"]) == (support, epsilon, threshold):
            return int(r["needed"])
    raise AssertionError("row missing")


def test_least_favourable_alternative_is_at_tv_epsilon_with_chi2_four_epsilon_squared():
    for support in (2, 16, 256):
        p0, p1 = least_favourable(support, 0.05)
        assert 0.5 * np.abs(p1 - p0).sum() == pytest.approx(0.05)
        assert ((p1 - p0) ** 2 / p0).sum() == pytest.approx(4 * 0.05**2)
        assert p1.min() >= 0
        assert p1.sum() == pytest.approx(1.0)


def test_lookup_returns_a_grid_point_and_rounds_every_argument_the_conservative_way():
    beta = float(load_table()["beta_bound"])
    exact = eprocess_needed(16, 0.05, 1e5, beta)
    assert exact >= _row(16, 0.05, 1e5)
    rows = load_table()["rows"]
    assert exact == max(r["needed"] for r in rows if r["support"] <= 16 and r["epsilon"] >= 0.05 and r["threshold"] <= 1e5)
    # A smaller support, a larger epsilon, a lower threshold: never fewer than the grid point above.
    assert eprocess_needed(10, 0.07, 3e4, beta) == eprocess_needed(16, 0.05, 1e5, beta)
    assert eprocess_needed(10, 0.07, 3e4, beta) >= _row(16, 0.1, 1e5)
    # The needed observations grow with the support and the threshold and shrink with epsilon.
    assert _row(256, 0.05, 1e5) > _row(16, 0.05, 1e5) > _row(2, 0.05, 1e5)
    assert _row(16, 0.05, 1e5) >= _row(16, 0.05, 1e3)
    assert _row(16, 0.1, 1e5) < _row(16, 0.05, 1e5)


def test_lookup_outside_the_table_is_none_so_the_caller_keeps_the_pearson_design():
    beta = float(load_table()["beta_bound"])
    assert eprocess_needed(4096, 0.05, 1e5, beta) is None  # support above the grid
    assert eprocess_needed(16, 0.01, 1e5, beta) is None  # epsilon below the grid
    assert eprocess_needed(16, 0.05, 1e9, beta) is None  # threshold above the grid
    assert eprocess_needed(16, 0.05, 1e5, beta / 10) is None  # a miss rate the runs cannot vouch for
    with pytest.raises(ValueError, match="epsilon > 0"):
        eprocess_needed(16, 0.0, 1e5, beta)


def test_the_tabulated_n_misses_at_most_the_claimed_rate_and_half_of_it_misses_often():
    """Fresh seed, the suite's own e-process. At the tabulated n the miss rate is <= beta_bound (about 1e-3):
    2000 runs then see more than 8 misses with probability < 1e-4; a table 2x too small would miss far more often."""
    n = _row(2, 0.1, 1e3)
    rng = np.random.default_rng(39)
    assert count_misses(2, 0.1, 1e3, n=n, runs=2000, rng=rng) <= 8
    assert count_misses(2, 0.1, 1e3, n=n // 2, runs=2000, rng=rng) > 8


def test_more_observations_than_tabulated_miss_no_more_often():
    """A check of reach < 1 holds more than its tabulated n at the cap: the miss rate there is still within the bound
    (computed: the e-value is not monotone in n, so this is measured, docs/statistics.md §7)."""
    n = _row(16, 0.1, 1e5)
    rng = np.random.default_rng(391)
    assert count_misses(16, 0.1, 1e5, n=math.ceil(1.3 * n), runs=2000, rng=rng) <= 8
    assert count_misses(16, 0.1, 1e5, n=n // 2, runs=2000, rng=rng) > 8


def test_the_table_is_a_full_grid_covering_the_profiles():
    rows = load_table()["rows"]
    supports = {r["support"] for r in rows}
    epsilons = {r["epsilon"] for r in rows}
    thresholds = {r["threshold"] for r in rows}
    assert len(rows) == len(supports) * len(epsilons) * len(thresholds)
    assert {0.02, 0.03, 0.05, 0.1, 0.3} <= epsilons  # the profiles' TVs; 0.3: the vLLM and SGLang interpreter cases
    assert max(supports) >= 1024
    assert max(thresholds) >= 1e7  # a 400-check run at alpha = 1e-4: T = 4e6
