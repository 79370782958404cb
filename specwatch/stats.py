"""Statistics of the suite: support check, e-process, sample-size planner, cross-checks.

Pure functions over numpy arrays; randomness comes in as a ``numpy.random.Generator``.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import optimize, special, stats

from specwatch.eprocess_power import eprocess_needed, tabulated_epsilons

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Concentrations of the Dirichlet(kappa * p0) mixture: 2^0 .. 2^26 (docs/statistics.md §4).
KAPPA_GRID: FloatArray = 2.0 ** np.arange(0, 27, dtype=np.float64)


def support_violations(counts: NDArray[np.integer], p0: NDArray[np.floating]) -> int:
    """Observations in cells the null gives probability 0: any one refutes H0 with certainty."""
    return int(np.asarray(counts)[np.asarray(p0) <= 0].sum())


def log_e_dirichlet_mixture(counts: NDArray[np.integer], p0: NDArray[np.floating], kappas: FloatArray = KAPPA_GRID) -> float:
    """Log of the Dirichlet(kappa * p0)-mixture likelihood-ratio e-process after ``counts``.

    H0: the observations are i.i.d. from p0. For each kappa the Dirichlet-multinomial predictive
    against p0 is a test martingale; their average over ``kappas`` is too, so under H0
    P(sup_n E_n >= 1/a) <= a for every a (Ville 1939): valid under continuous monitoring, any V, any
    expected counts. Cells with p0 = 0 are excluded (check them with ``support_violations``).
    References: docs/statistics.md §4-§5; Robbins 1970 (mixture martingales); Ville 1939; Ramdas et al. 2023.
    """
    counts_arr = np.asarray(counts, dtype=np.float64)
    p = np.asarray(p0, dtype=np.float64)
    keep = (counts_arr > 0) & (p > 0)
    n = float(counts_arr[keep].sum())
    if n == 0.0:
        return 0.0
    n_i, p_i = counts_arr[keep], p[keep]
    kp = kappas[:, None] * p_i[None, :]
    # Cells with no observations contribute lgamma(kp) - lgamma(kp) = 0, so only observed cells
    # are summed: O(#observed cells) per kappa, whatever V is.
    per_kappa = (
        special.gammaln(kappas)
        - special.gammaln(n + kappas)
        + (special.gammaln(n_i[None, :] + kp) - special.gammaln(kp)).sum(axis=1)
        - float(np.dot(n_i, np.log(p_i)))
    )
    return float(special.logsumexp(per_kappa) - math.log(len(kappas)))


def rejection_threshold(alpha: float, tests: int) -> float:
    """e-Bonferroni: reject test i when E_i >= m / alpha; family-wise error <= alpha (Vovk & Wang 2021)."""
    if not 0 < alpha < 1 or tests < 1:
        raise ValueError("alpha must be in (0, 1) and tests >= 1")
    return tests / alpha


def pearson_noncentrality(support: int, alpha: float, beta: float) -> float:
    """Noncentrality lambda with P(chi'^2_k(lambda) > chi^2_{k,1-alpha}) = 1 - beta, k = support - 1."""
    k = max(support - 1, 1)
    critical = float(stats.chi2.isf(alpha, k))

    def miss(lam: float) -> float:
        return float(stats.ncx2.cdf(critical, k, lam)) - beta

    hi = 1.0
    while miss(hi) > 0:
        hi *= 2.0
    return float(optimize.brentq(miss, 1e-9, hi, xtol=1e-6))


def pearson_sample_size(support: int, epsilon: float, alpha: float, beta: float) -> int:
    """Fixed-n Pearson chi^2 sample size for power 1 - beta at TV distance epsilon, level alpha.

    Least-favourable alternative (chi^2 divergence 4 epsilon^2, docs/statistics.md §7); the
    noncentral chi^2 law is evaluated exactly, not by its normal approximation.
    """
    return math.ceil(pearson_noncentrality(support, alpha, beta) / (4.0 * epsilon**2))


def detectable_epsilon(support: int, n: float, alpha: float, beta: float) -> float:
    """Smallest TV distance the fixed-n Pearson design detects with n observations (inverse of the above)."""
    if n <= 0:
        return math.inf
    return math.sqrt(pearson_noncentrality(support, alpha, beta) / (4.0 * n))


#: Outside the shipped e-process power table (``eprocess_power``: support above its largest, threshold above its
#: largest, epsilon below its smallest, beta below its bound, a corner none of its grids simulated) a check needs this
#: multiple of the fixed-n Pearson design. Not proved: the table's 690 rows need 0.41-1.80 x Pearson (1.18-1.43 at
#: 1024 cells, 1.13-1.46 at 65,536 and 131,072, the largest at 2 cells; docs/statistics.md §7), so 2 covers every
#: simulated row; beyond them it is an extrapolation. Logged as a warning.
PEARSON_FALLBACK_FACTOR = 2.0

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckDesign:
    """Planned observations for one test: ``needed`` observations at its position, given ``reach``; ``tabulated``
    when they come from the e-process power table, False for the Pearson fallback."""

    support: int
    reach: float
    needed: int
    tabulated: bool = True

    def trials(self) -> float:
        return math.inf if self.reach <= 0 else self.needed / self.reach


def plan_test(support: int, reach: float, epsilon: float, alpha: float, beta: float) -> CheckDesign:
    """Observations a test needs so the e-process crosses 1 / ``alpha`` with probability >= 1 - beta at TV epsilon.

    ``alpha`` is the test's own level (the run's alpha split by Bonferroni). The e-process's own power, looked up
    conservatively in ``eprocess_power.json`` (fixed-n: valid whatever looks the runner makes before); outside the
    table ``PEARSON_FALLBACK_FACTOR`` x the Pearson design, logged. Trials to run are ``needed / reach``: a test of
    position t sees only the trials that reach t.
    """
    needed = eprocess_needed(support, epsilon, 1.0 / alpha, beta)
    if needed is not None:
        return CheckDesign(support=support, reach=reach, needed=needed)
    _warn_untabulated(support, epsilon, alpha, beta)
    fallback = math.ceil(PEARSON_FALLBACK_FACTOR * pearson_sample_size(support, epsilon, alpha, beta))
    return CheckDesign(support=support, reach=reach, needed=fallback, tabulated=False)


@functools.cache
def _warn_untabulated(support: int, epsilon: float, alpha: float, beta: float) -> None:
    _log.warning(
        "support %d, TV %g, threshold %.3g, beta %g lies outside the e-process power table: sized at %g x the Pearson "
        "design (measured, not proved; docs/statistics.md §7)",
        support,
        epsilon,
        1.0 / alpha,
        beta,
        PEARSON_FALLBACK_FACTOR,
    )


def design_epsilon(support: int, n: float, alpha: float, beta: float) -> float:
    """Smallest TV distance the design of ``plan_test`` detects with n observations (its inverse): the smallest
    tabulated epsilon whose lookup needs at most n, else the Pearson fallback's inverse; inf when n <= 0."""
    if n <= 0:
        return math.inf
    floor = 0.0
    for epsilon in tabulated_epsilons():
        needed = eprocess_needed(support, epsilon, 1.0 / alpha, beta)
        if needed is not None and needed <= n:
            return epsilon
        floor = epsilon if needed is not None else floor  # the table covers this check: never claim below its last row
    return max(floor, detectable_epsilon(support, n / PEARSON_FALLBACK_FACTOR, alpha, beta))


def trials_for_observations(needed: int, reach: float, shortfall: float, *, limit: int | None = None) -> float:
    """Fewest trials n with P(Binomial(n, reach) < needed) <= ``shortfall``: a check of a position reached with
    probability ``reach`` then gets its ``needed`` observations except with that probability. A ``reach`` above 1 is
    a check that sees that many observations in every trial (every token of a long horizon): ceil(needed / reach).

    inf when ``reach`` is 0; at most ``limit`` when given (the search stops there).
    """
    if needed <= 0:
        return 0.0
    if reach <= 0:
        return math.inf
    if reach >= 1:  # a long-horizon check: ``reach`` observations in every trial
        return float(math.ceil(needed / reach))
    lo, hi = needed, max(needed, math.ceil(needed / reach))
    while stats.binom.cdf(needed - 1, hi, reach) > shortfall:
        lo, hi = hi, 2 * hi
        if limit is not None and lo >= limit:
            return float(limit)
    while lo < hi:  # the smallest n in (lo, hi] that is short with probability <= shortfall
        mid = (lo + hi) // 2
        if stats.binom.cdf(needed - 1, mid, reach) > shortfall:
            lo = mid + 1
        else:
            hi = mid
    return float(hi)


def tv_distance(a: NDArray[np.floating], b: NDArray[np.floating]) -> float:
    return 0.5 * float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).sum())


def tv_interval(counts: NDArray[np.integer], p0: NDArray[np.floating], confidence: float = 0.99) -> tuple[float, float, float]:
    """Plug-in TV(P_hat, p0) and a conservative confidence interval for TV(P, p0) at a FIXED n.

    Descriptive when n is a data-dependent stopping time (the runner stops at a rejection) or the check is
    chosen from the data: the coverage is then not guaranteed (it is not a confidence sequence).

    With K = |supp(p0)|: E TV(P_hat, P) <= sqrt(K / n) / 2 (Cauchy-Schwarz) and TV(P_hat, P)
    concentrates within sqrt(ln(2/delta) / 2n) (McDiarmid), so TV(P, p0) lies within
    tv_hat -/+ their sum with probability >= confidence when P is supported on supp(p0).
    """
    c = np.asarray(counts, dtype=np.float64)
    n = float(c.sum())
    if n == 0:
        return 0.0, 0.0, 1.0
    tv_hat = tv_distance(c / n, p0)
    k = int((np.asarray(p0) > 0).sum())
    half_width = 0.5 * math.sqrt(k / n) + math.sqrt(math.log(2.0 / (1.0 - confidence)) / (2.0 * n))
    return tv_hat, max(0.0, tv_hat - half_width), min(1.0, tv_hat + half_width)


def weighted_chi2(counts: NDArray[np.integer], p0: NDArray[np.floating]) -> FloatArray:
    """Valiant-Valiant-type unbiased weighted statistic sum ((N_i - n p_i)^2 - N_i) / p_i^(2/3).

    Vectorised over leading axes of ``counts``; cells with p0 = 0 are excluded.
    """
    keep = np.asarray(p0) > 0
    p = np.asarray(p0, dtype=np.float64)[keep]
    c = np.asarray(counts, dtype=np.float64)[..., keep]
    n = c.sum(axis=-1, keepdims=True)
    result: FloatArray = (((c - n * p) ** 2 - c) / p ** (2.0 / 3.0)).sum(axis=-1)
    return result


def weighted_chi2_pvalue(counts: NDArray[np.integer], p0: NDArray[np.floating], rng: np.random.Generator, draws: int = 999) -> float:
    """Monte-Carlo-calibrated p-value of the weighted chi^2 statistic (a fixed-n cross-check).

    Valid only at a fixed n chosen in advance; the runner computes it at a data-dependent stop on its
    headline check, so there it is descriptive, never a decision.

    p = (1 + #{T_b >= T}) / (B + 1) with T_b simulated exactly under H0 (multinomial(n, p0)):
    valid for every B (Barnard 1963; Besag & Clifford 1989). No asymptotic critical values.
    """
    c = np.asarray(counts, dtype=np.int64)
    n = int(c.sum())
    if n == 0:
        return 1.0
    p = np.asarray(p0, dtype=np.float64)
    observed = float(weighted_chi2(c, p))
    null = weighted_chi2(rng.multinomial(n, p / p.sum(), size=draws), p)
    return float((1 + np.count_nonzero(null >= observed)) / (draws + 1))


def pearson_statistic(counts: NDArray[np.integer], p0: NDArray[np.floating]) -> FloatArray:
    """Pearson's X^2 over cells with p0 > 0, vectorised over leading axes."""
    keep = np.asarray(p0) > 0
    p = np.asarray(p0, dtype=np.float64)[keep]
    c = np.asarray(counts, dtype=np.float64)[..., keep]
    n = c.sum(axis=-1, keepdims=True)
    result: FloatArray = ((c - n * p) ** 2 / (n * p)).sum(axis=-1)
    return result


def least_favourable(support: int, epsilon: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(p0, p1): p0 uniform on ``support`` cells, p1 = p0 (1 + 2 eps) on one half and p0 (1 - 2 eps) on the other.

    TV(p0, p1) = epsilon and chi^2(p1 || p0) = 4 epsilon^2, the least any law at TV epsilon has (docs/statistics.md §7).
    For odd ``support`` the last cell keeps p0 (TV still epsilon, chi^2 a little above 4 epsilon^2); the table uses even supports.
    """
    if support < 2 or not 0 < epsilon <= 0.5:
        raise ValueError("support >= 2 and epsilon in (0, 0.5] are required")
    p0 = np.full(support, 1.0 / support)
    half = support // 2
    shift = epsilon / half  # each of the ``half`` cells gains (or loses) shift: TV = half * shift = epsilon
    if shift > 1.0 / support:
        raise ValueError("epsilon too large for this support")
    p1 = p0.copy()
    p1[:half] += shift
    p1[half : 2 * half] -= shift
    return p0, p1


def count_misses(
    support: int, epsilon: float, threshold: float, *, n: int, runs: int, rng: np.random.Generator, stop_at: int | None = None
) -> int:
    """Runs, of ``runs`` drawn with n observations from ``least_favourable``, whose e-process stays below ``threshold``.

    The e-value is ``stats.log_e_dirichlet_mixture``, the function the suite itself calls. Counting stops once
    ``stop_at`` misses are seen (the search for the smallest n needs only to know whether there was one).
    """
    p0, p1 = least_favourable(support, epsilon)
    log_t = math.log(threshold)
    missed = 0
    for row in rng.multinomial(n, p1, size=runs):
        if log_e_dirichlet_mixture(row, p0) < log_t:
            missed += 1
            if stop_at is not None and missed >= stop_at:
                break
    return missed
