"""The e-process's misses under the least-favourable alternative at large supports: the same law and statistic as
``stats.count_misses``, drawn and evaluated through count histograms.

``stats.count_misses`` draws each run's counts with ``rng.multinomial`` over all k cells and evaluates
``stats.log_e_dirichlet_mixture`` on them: O(k) draws and O(len(kappas) x observed cells) log-gamma terms per run,
about 40-60 ms a run at k = 65,536 (n 1e5-4e5): hours for the large grid. :func:`count_misses_by_histogram` gives

- **the same law, by construction**: p1 (``stats.least_favourable``) is constant on each of its two halves, so an
  observation from p1 falls in the first half with probability p1(first half) and then uniformly on that half's cells.
  Hence N_A ~ Binomial(n, p1(first half)) and, given N_A, each half's counts are Multinomial(N_A or n - N_A, uniform):
  drawn as uniform cell indices and counted. The counts vector has law Multinomial(n, p1), as ``count_misses``'s.
- **the same statistic, up to float rounding**: with p0 uniform on k cells every cell with count c adds the same term
  ``gammaln(c + kappa / k) - gammaln(kappa / k)`` to ``log_e_dirichlet_mixture``'s sum over observed cells, so the sum
  is sum_c h_c term(c) with h_c the number of cells holding c observations (:func:`log_e_from_histogram`). Each call
  recomputes the first run's e-value with ``log_e_dirichlet_mixture`` itself on its full counts and raises if the two
  differ (a changed mixture then cannot feed the table a stale formula).

Used by ``bench/eprocess_power_table.py`` for supports above 1024; ``tests/unit/specwatch/test_eprocess_simulation.py``
checks both claims against ``count_misses`` and ``log_e_dirichlet_mixture``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray
from scipy import special

from specwatch.stats import KAPPA_GRID, FloatArray, least_favourable, log_e_dirichlet_mixture

#: Most cell draws held in memory at once (int64): runs are drawn in chunks of about this many observations.
CHUNK_DRAWS = 1 << 22
#: ``log_e_from_histogram`` and ``log_e_dirichlet_mixture`` must agree this closely (absolute, in log e).
CROSS_CHECK_TOLERANCE = 1e-6


def log_e_from_histogram(histograms: NDArray[np.integer], support: int, kappas: FloatArray = KAPPA_GRID) -> FloatArray:
    """``stats.log_e_dirichlet_mixture(counts, uniform(support))`` of every row, from count histograms.

    Row r of ``histograms`` holds h_c = the number of cells with c observations (column c, c >= 0) of run r, whose
    counts are over ``support`` cells. With p0 = 1/k on every cell and n = sum_c c h_c, for each kappa:
    log E_kappa = lgamma(kappa) - lgamma(n + kappa) + sum_{c >= 1} h_c [lgamma(c + kappa/k) - lgamma(kappa/k)] + n ln k,
    and log E = logsumexp_kappa log E_kappa - ln(len(kappas)): the same sum as the suite's function, grouped by count.
    """
    h = np.atleast_2d(np.asarray(histograms, dtype=np.float64))
    c = np.arange(h.shape[1], dtype=np.float64)
    n = h @ c
    a = kappas / support
    term = special.gammaln(c[None, :] + a[:, None]) - special.gammaln(a)[:, None]  # (kappas, counts); column 0 is 0
    per_kappa = special.gammaln(kappas)[None, :] - special.gammaln(n[:, None] + kappas[None, :]) + h @ term.T
    per_kappa += (n * math.log(support))[:, None]
    result: FloatArray = np.where(n > 0, special.logsumexp(per_kappa, axis=1) - math.log(len(kappas)), 0.0)
    return result


def draw_counts(support: int, epsilon: float, n: int, runs: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """``runs`` count vectors (runs x support) of n observations from ``least_favourable(support, epsilon)[1]``.

    Law Multinomial(n, p1) (module docstring): N_A ~ Binomial(n, p1(first half)), then N_A uniform indices on the first
    half's cells and n - N_A on the second's, counted. ``support`` must be even (p1 is then constant on each half).
    """
    if support % 2:
        raise ValueError("an even support is required")
    _, p1 = least_favourable(support, epsilon)
    half = support // 2
    first = rng.binomial(n, float(p1[:half].sum()), size=runs)
    offsets = np.arange(runs, dtype=np.int64) * support
    in_first = np.repeat(offsets, first)
    in_second = np.repeat(offsets + half, n - first)
    cells = np.concatenate((in_first + rng.integers(0, half, size=in_first.size), in_second + rng.integers(0, half, size=in_second.size)))
    counts: NDArray[np.int64] = np.bincount(cells, minlength=runs * support).reshape(runs, support)
    return counts


def count_histograms(counts: NDArray[np.integer]) -> NDArray[np.int64]:
    """Row r: the number of cells of ``counts[r]`` holding c observations, for c = 0 .. max count."""
    counts_arr = np.asarray(counts, dtype=np.int64)
    width = int(counts_arr.max(initial=0)) + 1
    rows = counts_arr.shape[0]
    shifted = counts_arr + (np.arange(rows, dtype=np.int64) * width)[:, None]
    histograms: NDArray[np.int64] = np.bincount(shifted.ravel(), minlength=rows * width).reshape(rows, width)
    return histograms


def simulated_log_e(support: int, epsilon: float, n: int, runs: int, rng: np.random.Generator) -> Iterator[FloatArray]:
    """The e-values (``log_e_dirichlet_mixture`` against uniform p0) of ``runs`` runs of n observations from
    ``least_favourable(support, epsilon)``, chunk by chunk: at most ``CHUNK_DRAWS`` observations or cells per chunk,
    the first chunk a single run (a caller that stops at the first miss far below the answer then draws one run).
    Raises RuntimeError when the first run's grouped e-value differs from ``log_e_dirichlet_mixture``'s."""
    most = max(1, CHUNK_DRAWS // max(n, support))
    done, chunk = 0, 1
    while done < runs:
        size = min(chunk, runs - done)
        counts = draw_counts(support, epsilon, n, size, rng)
        log_e = log_e_from_histogram(count_histograms(counts), support)
        if done == 0:
            _cross_check(counts[0], float(log_e[0]), support)
        yield log_e
        done += size
        chunk = min(2 * chunk, most)


def count_misses_by_histogram(
    support: int, epsilon: float, threshold: float, *, n: int, runs: int, rng: np.random.Generator, stop_at: int | None = None
) -> int:
    """``stats.count_misses`` for an even support, fast: runs whose e-process after n observations from
    ``least_favourable(support, epsilon)`` stays below ``threshold``; counting stops once ``stop_at`` misses are seen.

    Same law and same statistic (module docstring), different random stream: for a given ``rng`` the counts differ
    from ``count_misses``'s, their law does not (:func:`simulated_log_e`).
    """
    log_t = math.log(threshold)
    missed = 0
    for log_e in simulated_log_e(support, epsilon, n, runs, rng):
        missed += int(np.count_nonzero(log_e < log_t))
        if stop_at is not None and missed >= stop_at:
            return stop_at
    return missed


def _cross_check(counts: NDArray[np.int64], grouped: float, support: int) -> None:
    plain = log_e_dirichlet_mixture(counts, np.full(support, 1.0 / support))
    if not abs(plain - grouped) <= CROSS_CHECK_TOLERANCE * max(1.0, abs(plain)):
        raise RuntimeError(f"grouped e-value {grouped!r} differs from log_e_dirichlet_mixture's {plain!r}: the formula is stale")
