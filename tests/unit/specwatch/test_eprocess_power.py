"""The shipped e-process power table: conservative lookup, and the miss rate it claims re-measured with fresh seeds."""

from __future__ import annotations

import itertools
import logging
import math

import numpy as np
import pytest
import torch

from specwatch.cases import DIRECT_CASES, select
from specwatch.eprocess_power import eprocess_needed, load_table
from specwatch.eprocess_simulation import count_misses_by_histogram
from specwatch.evidence import designed_checks
from specwatch.sampling import reference_sampler
from specwatch.stats import count_misses, least_favourable, plan_test, rejection_threshold


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
    assert eprocess_needed(200_000, 0.05, 1e5, beta) is None  # support above the grid
    assert eprocess_needed(50_257, 0.03, 1e5, beta) is None  # a corner the large-support grid does not simulate
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


def test_a_large_support_row_misses_at_most_the_claimed_rate_and_half_of_it_misses_often():
    """The same at 65,536 cells (simulated by count histograms, a fresh seed): at the tabulated n at most 8 misses in
    2000 runs, at half of it more."""
    n = _row(65536, 0.5, 1e5)
    rng = np.random.default_rng(394)
    assert count_misses_by_histogram(65536, 0.5, 1e5, n=n, runs=2000, rng=rng) <= 8
    assert count_misses_by_histogram(65536, 0.5, 1e5, n=n // 2, runs=2000, rng=rng) > 8


def test_more_observations_than_tabulated_miss_no_more_often():
    """A check of reach < 1 holds more than its tabulated n at the cap: the miss rate there is still within the bound
    (computed: the e-value is not monotone in n, so this is measured, docs/statistics.md §7)."""
    n = _row(16, 0.1, 1e5)
    rng = np.random.default_rng(391)
    assert count_misses(16, 0.1, 1e5, n=math.ceil(1.3 * n), runs=2000, rng=rng) <= 8
    assert count_misses(16, 0.1, 1e5, n=n // 2, runs=2000, rng=rng) > 8


def test_the_table_is_the_union_of_its_full_grids_covering_the_profiles():
    table = load_table()
    corners = [(r["support"], r["epsilon"], r["threshold"]) for r in table["rows"]]
    grids = table["grids"]
    assert sorted(corners) == sorted(set(itertools.chain.from_iterable(itertools.product(*g.values()) for g in grids)))
    small, large = grids
    assert {0.02, 0.03, 0.05, 0.1, 0.3} <= set(small["epsilons"])  # the profiles' TVs; 0.3: the vLLM and SGLang interpreter cases
    assert max(small["supports"]) >= 1024
    assert max(small["thresholds"]) >= 1e7  # a 400-check run at alpha = 1e-4: T = 4e6
    # The 50,257-token case: its checks have 50,257 and 77,356 cells, designed at 0.05 (reference) and 0.1 (libraries).
    assert max(large["supports"]) >= 2 * 50_257
    assert {0.05, 0.1} <= set(large["epsilons"])
    # From the case alone (4 checks: T = 4e4, rounded up to 1e5) to a 1000-check run (T = 1e7).
    assert min(large["thresholds"]) <= 1e5
    assert max(large["thresholds"]) >= 1e7
    assert set(large["thresholds"]) <= set(small["thresholds"])


def test_the_large_supports_need_more_as_the_support_grows_and_fewer_as_epsilon_does():
    large = load_table()["grids"][1]
    for epsilon, threshold in itertools.product(large["epsilons"], large["thresholds"]):
        needed = [_row(k, epsilon, threshold) for k in [1024, *large["supports"]]]
        assert needed == sorted(needed), (epsilon, threshold)
    for support, threshold in itertools.product(large["supports"], large["thresholds"]):
        needed = [_row(support, epsilon, threshold) for epsilon in large["epsilons"]]
        assert needed == sorted(needed, reverse=True), (support, threshold)


@pytest.mark.parametrize("epsilon", [0.05, 0.1])
@pytest.mark.parametrize("tests", [4, 211, 450])  # the case alone, the reference battery, a library run (T 4.5e6)
def test_the_large_vocabulary_case_is_sized_from_the_table_not_the_fallback(epsilon, tests, caplog):
    """Issue 39 item 4: every designed check of direct/large_vocab/V50257/g1 (50,257 and 77,356 cells) reads a
    simulated row (the table up to suite 0.4.0 stopped at 1024 cells: 2 x Pearson, with a warning)."""
    (case,) = select(["direct/large_vocab/V50257/g1"], DIRECT_CASES)
    experiment = case.build(reference_sampler, torch.device("cpu"))
    checks = designed_checks(experiment, epsilon)
    assert max(c.support for c in checks) > 50_000
    alpha_test = 1.0 / rejection_threshold(1e-4, tests)
    with caplog.at_level(logging.WARNING, logger="specwatch.stats"):
        designs = [plan_test(c.support, c.reach, epsilon, alpha_test, 1e-3) for c in checks]
    assert all(d.tabulated for d in designs)
    assert "outside the e-process power table" not in caplog.text
