"""The fast large-support simulation of the power table: the same law and the same e-value as stats.count_misses."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from specwatch import eprocess_simulation
from specwatch.eprocess_simulation import count_histograms, count_misses_by_histogram, draw_counts, log_e_from_histogram
from specwatch.stats import count_misses, least_favourable, log_e_dirichlet_mixture


class TestLogEFromHistogram:
    @pytest.mark.parametrize(("support", "n"), [(2, 7), (16, 40), (1024, 300), (1024, 5000), (65536, 20_000), (65536, 300_000)])
    def test_equals_the_suite_e_value_on_the_same_counts(self, support, n):
        rng = np.random.default_rng([support, n])
        # Counts from the alternative, from a law far from uniform, and with empty cells: the identity holds for any counts.
        rows = [
            *draw_counts(support, 0.1, n, 2, rng),
            rng.multinomial(n, rng.dirichlet(np.full(support, 0.3))),
        ]
        p0 = np.full(support, 1.0 / support)
        grouped = log_e_from_histogram(count_histograms(np.stack(rows)), support)
        plain = [log_e_dirichlet_mixture(row, p0) for row in rows]
        np.testing.assert_allclose(grouped, plain, rtol=1e-9, atol=1e-8)

    def test_no_observations_is_e_value_one(self):
        assert log_e_from_histogram(np.array([[8]]), 8).tolist() == [0.0]

    def test_histograms_count_cells_per_count(self):
        assert count_histograms(np.array([[0, 2, 2, 1], [3, 0, 0, 0]])).tolist() == [[1, 1, 2, 0], [3, 0, 0, 1]]


class TestDrawCounts:
    def test_each_run_has_n_observations_and_halves_with_their_means(self):
        support, epsilon, n = 4096, 0.1, 50_000
        counts = draw_counts(support, epsilon, n, 40, np.random.default_rng(1))
        assert counts.shape == (40, support)
        assert (counts.sum(axis=1) == n).all()
        first = counts[:, : support // 2].sum(axis=1)
        # Binomial(n, 1/2 + epsilon): mean 30,000, sd about 110; 40 runs average within 5 sd / sqrt(40).
        assert abs(first.mean() - n * (0.5 + epsilon)) < 5 * math.sqrt(n * 0.24 / 40)

    def test_the_count_vectors_follow_the_multinomial_law_exactly(self):
        """Every count vector of 5 observations over 4 cells against its Multinomial(5, p1) probability, by the suite's
        own e-process at level 1e-4 (valid for any counts). A sampler whose split between the halves has the right mean
        but not the binomial law (3 or 4 of 5 in the first half) is rejected by the same test: it can fail."""
        support, epsilon, n, runs = 4, 0.2, 5, 100_000
        _, p1 = least_favourable(support, epsilon)
        vectors = [v for v in itertools.product(range(n + 1), repeat=support) if sum(v) == n]
        index = {v: i for i, v in enumerate(vectors)}
        law = np.array([scipy_stats.multinomial.pmf(v, n, p1) for v in vectors])

        def cells(counts: np.ndarray) -> np.ndarray:
            return np.bincount([index[tuple(int(x) for x in row)] for row in counts], minlength=len(vectors))

        drawn = cells(draw_counts(support, epsilon, n, runs, np.random.default_rng(2)))
        assert log_e_dirichlet_mixture(drawn, law) < math.log(1e4)
        rng = np.random.default_rng(3)
        first = 3 + rng.integers(0, 2, size=runs)  # mean n p1(first half) = 3.5, as Binomial(5, 0.7)
        wrong = np.stack([np.concatenate((rng.multinomial(a, [0.5, 0.5]), rng.multinomial(n - a, [0.5, 0.5]))) for a in first])
        assert log_e_dirichlet_mixture(cells(wrong), law) > math.log(1e4)

    def test_an_odd_support_is_refused(self):
        with pytest.raises(ValueError, match="even"):
            draw_counts(7, 0.1, 10, 1, np.random.default_rng(0))


class TestCountMissesByHistogram:
    def test_misses_as_often_as_count_misses(self):
        """Where about a third of the runs miss, 3000 runs of each count agree within sampling error (two binomials,
        Fisher's exact test at 1e-3); the same count at 1.5 n would disagree."""
        support, epsilon, threshold, n = 64, 0.1, 1e5, 2000
        fast = count_misses_by_histogram(support, epsilon, threshold, n=n, runs=3000, rng=np.random.default_rng(4))
        plain = count_misses(support, epsilon, threshold, n=n, runs=3000, rng=np.random.default_rng(5))
        assert 300 < plain < 2700
        assert scipy_stats.fisher_exact([[fast, 3000 - fast], [plain, 3000 - plain]]).pvalue > 1e-3
        more = count_misses(support, epsilon, threshold, n=3 * n // 2, runs=3000, rng=np.random.default_rng(6))
        assert scipy_stats.fisher_exact([[fast, 3000 - fast], [more, 3000 - more]]).pvalue < 1e-3

    def test_stops_at_the_requested_misses(self):
        assert count_misses_by_histogram(64, 0.1, 1e5, n=10, runs=3000, rng=np.random.default_rng(7), stop_at=1) == 1

    def test_a_changed_mixture_is_caught_by_the_cross_check(self, monkeypatch):
        monkeypatch.setattr(eprocess_simulation, "log_e_dirichlet_mixture", lambda counts, p0: 0.5 * log_e_dirichlet_mixture(counts, p0))
        with pytest.raises(RuntimeError, match="stale"):
            count_misses_by_histogram(64, 0.1, 1e5, n=2000, runs=10, rng=np.random.default_rng(8))
