"""The long-horizon conditional check: exact uniformity of the randomized PIT, calibration of the
e-process over many simulated runs, power against realistic deviations, certain violations, margins."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specwatch.conditional import (
    PIT_BINS,
    TokenOrder,
    conditional_batch,
    pit_bins,
    pit_null,
    processing_margin,
    processing_margins,
    randomized_pit,
)
from specwatch.stats import log_e_dirichlet_mixture


def _rows(rng: np.random.Generator, n: int, vocab: int, concentration: float = 0.5) -> np.ndarray:
    return rng.dirichlet(np.full(vocab, concentration), size=n)


def _sample(rng: np.random.Generator, rows: np.ndarray) -> np.ndarray:
    cumulative = rows.cumsum(axis=1)
    u = rng.random(len(rows))[:, None]
    return np.minimum((cumulative < u).sum(axis=1), rows.shape[1] - 1).astype(np.int64)


@pytest.mark.parametrize("order", list(TokenOrder))
def test_the_binned_pit_of_a_correct_token_is_exactly_uniform(order):
    """For one row, integrate over the token (weight p(y)) and W (a fine midpoint grid): each bin gets 1/B."""
    rng = np.random.default_rng(0)
    row = _rows(rng, 1, 7)[0]
    row[3] = 0.0
    row /= row.sum()
    grid = (np.arange(4000) + 0.5) / 4000
    mass = np.zeros(PIT_BINS)
    for y in np.flatnonzero(row > 0):
        u = randomized_pit(np.repeat(row[None], len(grid), axis=0), np.full(len(grid), y), grid, order)
        mass += pit_bins(u) * row[y] / len(grid)
    np.testing.assert_allclose(mass, pit_null(), atol=1e-3)


def test_without_the_randomization_the_pit_is_not_uniform():
    """The check above can fail: W fixed at 0 (the plain discrete PIT) puts all mass at interval starts."""
    rng = np.random.default_rng(1)
    rows = _rows(rng, 20_000, 5)
    tokens = _sample(rng, rows)
    counts = pit_bins(randomized_pit(rows, tokens, np.zeros(len(rows)), TokenOrder.ID))
    assert log_e_dirichlet_mixture(counts, pit_null()) > math.log(1e6)


def _max_log_e(rng: np.random.Generator, trials: int, horizon: int, vocab: int, sampler) -> dict[TokenOrder, float]:
    """Monitor both orders' e-processes after every batch of 25 trials of ``horizon`` tokens each."""
    best = dict.fromkeys(TokenOrder, 0.0)
    totals = {o: np.zeros(PIT_BINS, dtype=np.int64) for o in TokenOrder}
    for _ in range(trials // 25):
        rows = _rows(rng, 25 * horizon, vocab)
        batch = conditional_batch(rows, sampler(rng, rows), rng.random(len(rows)))
        for order in TokenOrder:
            totals[order] += batch.counts[order]
            best[order] = max(best[order], log_e_dirichlet_mixture(totals[order], pit_null()))
    return best


def test_the_e_process_is_calibrated_under_continuous_monitoring():
    """300 simulated runs of 500 trials x 10 tokens from the exact conditional rows: the e-process crosses
    1/a in at most a fraction a of them (Ville), for a = 0.05, with a binomial 3-sigma allowance."""
    rng = np.random.default_rng(2)
    a, runs = 0.05, 300
    crossed = dict.fromkeys(TokenOrder, 0)
    for _ in range(runs):
        best = _max_log_e(rng, 500, 10, 6, _sample)
        for order in TokenOrder:
            crossed[order] += best[order] >= math.log(1 / a)
    bound = a + 3 * math.sqrt(a * (1 - a) / runs)
    assert all(c / runs <= bound for c in crossed.values()), crossed


def _too_greedy(rng: np.random.Generator, rows: np.ndarray) -> np.ndarray:
    """Sampling at temperature 0.8 instead of 1 (e.g. a processor applied twice)."""
    sharpened = rows**1.25
    return _sample(rng, sharpened / sharpened.sum(axis=1, keepdims=True))


def _shifted(rng: np.random.Generator, rows: np.ndarray) -> np.ndarray:
    """With probability 0.1 the token is replaced by the next id (an off-by-one in a vocabulary map)."""
    tokens = _sample(rng, rows)
    move = rng.random(len(tokens)) < 0.1
    return np.where(move, (tokens + 1) % rows.shape[1], tokens)


@pytest.mark.parametrize("sampler", [_too_greedy, _shifted])
def test_the_e_process_detects_realistic_deviations(sampler):
    """Power: each deviation crosses the suite's threshold scale (1e6) within 1,000 trials of 10 tokens
    under one of the two orders (the run tests both)."""
    best = _max_log_e(np.random.default_rng(3), 1000, 10, 6, sampler)
    assert max(best.values()) >= math.log(1e6), best


def test_a_token_of_probability_zero_is_a_certain_violation():
    rows = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    batch = conditional_batch(rows, np.array([2, 1]), np.array([0.5, 0.5]))
    assert batch.impossible is not None
    assert "position 1" in batch.impossible
    assert batch.tested == 1
    ok = conditional_batch(rows, np.array([1, 1]), np.array([0.5, 0.5]))
    assert ok.impossible is None
    assert ok.tested == 2


def test_positions_left_out_are_not_counted():
    rows = np.array([[0.5, 0.5], [0.2, 0.8], [0.9, 0.1]])
    batch = conditional_batch(rows, np.array([0, 1, 0]), np.full(3, 0.5), keep=np.array([True, False, True]))
    assert batch.tested == 2
    assert batch.skipped == 1
    assert all(c.sum() == 2 for c in batch.counts.values())


def test_the_probability_order_puts_likely_tokens_first():
    rows = np.array([[0.1, 0.6, 0.3]])
    u = randomized_pit(rows, np.array([1]), np.array([0.0]), TokenOrder.PROBABILITY)
    assert u[0] == 0.0
    u = randomized_pit(rows, np.array([0]), np.array([0.0]), TokenOrder.PROBABILITY)
    assert u[0] == pytest.approx(0.9)
    u = randomized_pit(rows, np.array([2]), np.array([0.0]), TokenOrder.ID)
    assert u[0] == pytest.approx(0.7)


def test_processing_margin_measures_the_distance_to_the_support_boundaries():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    assert processing_margin(logits, 1.0, None, None) == math.inf
    # top-k 2: gap between the 2nd and 3rd logit, relative
    assert processing_margin(logits, 1.0, 2, None) == pytest.approx((math.log(0.3) - math.log(0.2)) / abs(math.log(0.3)))
    # top-p 0.7: ascending cumulative 0.1, 0.3, 0.6 against 0.3 -> a cut exactly on the boundary
    assert processing_margin(logits, 1.0, None, 0.7) == pytest.approx(0.0, abs=1e-12)
    assert processing_margin(logits, 1.0, None, 0.75) == pytest.approx(0.05)
    tie = np.log(np.array([0.4, 0.3, 0.3]))
    assert processing_margin(tie, 1.0, 1, None) > 0
    assert processing_margin(tie, 1.0, 2, None) == 0.0


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, None, None), (2.0, 4, 0.7), (0.7, 50, 0.9), (1.0, 3, None), (1.3, None, 0.8)]
)
def test_the_vectorised_margins_equal_the_row_by_row_ones(temperature, top_k, top_p):
    rng = np.random.default_rng(7)
    logits = rng.normal(0.0, 3.0, size=(200, 64))
    logits[::7, :5] = -np.inf  # rows with masked tokens
    logits[::11, 10:14] = logits[::11, 9:10]  # ties
    expected = [processing_margin(row, temperature, top_k, top_p) for row in logits]
    np.testing.assert_allclose(processing_margins(logits, temperature, top_k, top_p), expected, rtol=1e-9, atol=1e-12)
