"""The early pass (docs/statistics.md §7a): evidence that a check's observations do not come from a law at TV
distance >= epsilon from its null, so that a clean case can stop before its cap with a proved bound on the misses.

Pure functions over numpy arrays, like :mod:`specwatch.stats`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray
from scipy import special

FloatArray = NDArray[np.float64]


def _neyman_pearson(p_hat: FloatArray, p0: FloatArray) -> tuple[FloatArray, FloatArray]:
    """The cells in decreasing order of P_hat / p0: their ratios (the slopes of the Neyman-Pearson curve) and p0
    masses. Through the corners (p0(first j), P_hat(first j)) the curve bounds P_hat(A) <= g(p0(A)) for every set A."""
    ratio = p_hat / p0
    order = np.argsort(-ratio, kind="stable")
    return ratio[order], p0[order]


#: The numerators of each set's likelihood ratios: for a set of null mass b, r = b + shrink x epsilon against the bug's
#: b + epsilon, one ratio per shrink, averaged with equal weights (docs/statistics.md §7a). 0 is the null itself: the
#: most evidence per observation when nothing is fitted, but the most sensitive to the set the data favour by chance.
NUMERATOR_SHRINKS: tuple[float, ...] = (0.25, 0.5)
#: The branch and bound over b: pieces of [0, 1 - epsilon] to start from, rounds of halving, most pieces.
PIECES, ROUNDS, MOST_PIECES = 32, 40, 1 << 14


def log_set_ratio(x: FloatArray | float, b: FloatArray | float, n: float, epsilon: float) -> FloatArray:
    """ln M: the mixture over :data:`NUMERATOR_SHRINKS` of the likelihood ratios of n binary observations, a fraction
    ``x`` of them in a set A of null mass ``b``, numerator r = b + shrink epsilon against the bug's c = b + epsilon.

    For a fixed A and r <= c each ratio is a test supermartingale under H_eps(A) (every observation falls in A with
    probability >= c given the past), so their average is one too. It decreases in x and increases in b (b <= 1 - eps),
    elementwise over arrays ``x`` and ``b``."""
    x_arr = np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)
    b_arr = np.asarray(b, dtype=np.float64)
    c = np.minimum(b_arr + epsilon, 1.0)
    logs = []
    for shrink in NUMERATOR_SHRINKS:
        r = b_arr + shrink * epsilon
        per = special.xlogy(x_arr, r) - special.xlogy(x_arr, c) + special.xlogy(1 - x_arr, 1 - r) - special.xlogy(1 - x_arr, 1 - c)
        logs.append(n * per)
    result: FloatArray = special.logsumexp(np.stack(logs), axis=0) - math.log(len(NUMERATOR_SHRINKS))
    return result


def _relaxed_bound(corners: FloatArray, heights: FloatArray, n: float, epsilon: float, level: float | None) -> float:
    """A lower bound of min over b in [0, 1 - eps] of ln M(g(b), b) (:func:`log_set_ratio`, g the Neyman-Pearson curve
    through ``corners`` and ``heights``), by branch and bound: on a piece [lo, hi], g(b) <= g(hi) and M decreases in x
    and increases in b, so ln M(g(hi), lo) bounds it; every piece's bound is valid, so the smallest is, at any round. It
    refines until the bound reaches ``level`` or a point of the curve shows that it cannot (then the bound is below
    ``level`` too); with no ``level``, towards the minimum."""

    def curve(b: FloatArray) -> FloatArray:
        result: FloatArray = np.minimum(np.interp(b, corners, heights), 1.0)
        return result

    top = 1.0 - epsilon
    edges = np.unique(np.concatenate((np.linspace(0.0, top, PIECES + 1), corners[corners < top])))
    lo, hi = edges[:-1], edges[1:]
    upper = float(log_set_ratio(curve(edges), edges, n, epsilon).min())
    bound = -math.inf
    for _ in range(ROUNDS):
        bounds = log_set_ratio(curve(hi), lo, n, epsilon)
        mid = (lo + hi) / 2
        upper = min(upper, float(log_set_ratio(curve(mid), mid, n, epsilon).min()))
        bound = float(bounds.min())
        goal = upper if level is None else min(upper, level)
        if bound >= goal - 1e-9 * max(1.0, abs(goal)) or (level is not None and upper < level) or 2 * len(lo) > MOST_PIECES:
            break
        split = bounds < goal
        middle = mid[split]
        lo, hi = np.concatenate((lo[split], middle)), np.concatenate((middle, hi[split]))
    return bound


def _cannot_reach(p_hat: FloatArray, p0: FloatArray, n: float, epsilon: float, level: float) -> bool:
    """True when ln M at the set A = {P_hat > p0} is below ``level`` (the statistic is a minimum over sets, so it is
    below too): a cheap O(k) test that spares large supports, which the overfitting keeps from passing, the full bound."""
    above = p_hat > p0
    a, b = float(p_hat[above].sum()), float(p0[above].sum())
    if b + epsilon > 1.0:
        return False
    return float(log_set_ratio(a, b, n, epsilon)) < level


def log_pass_statistic(counts: NDArray[np.integer], p0: NDArray[np.floating], epsilon: float, *, target: float | None = None) -> float:
    """Log of the early-pass statistic: evidence that the observations do NOT come from a law at TV >= epsilon.

    H_eps (what it tests, "a bug of size epsilon"): some fixed set A of cells receives, at every observation given
    everything before it, probability >= p0(A) + epsilon; i.i.d. observations from any Q with TV(Q, p0) >= epsilon
    are the main case. Guarantee: under H_eps, P(sup_n exp(statistic_n) >= 1/b) <= b for every b (Ville 1939), so
    passing when it reaches ln(1/b), at batch ends or at any stopping times, misses such a bug with probability at
    most b. The statistic is a lower bound of min_A ln M_A, M_A the mixture of likelihood ratios of the bug's own set
    (:func:`log_set_ratio`, a test supermartingale under H_eps(A)): the minimum over the 2^k sets relaxed to the
    Neyman-Pearson curve and bounded by branch and bound (any stage is valid), refined until it reaches ``target`` or
    shows that it cannot (None: towards its minimum; a statistic that one set shows cannot reach ``target`` is returned
    as its crudest bound, ln M(P_hat(all cells but the least likely ones), 0)). -inf after a support violation.
    docs/statistics.md §7a.
    """
    counts_arr = np.asarray(counts, dtype=np.float64)
    p = np.asarray(p0, dtype=np.float64)
    if counts_arr[p <= 0].any() or not 0.0 < epsilon < 1.0:
        return -math.inf
    keep = p > 0
    n = float(counts_arr[keep].sum())
    if n == 0.0:
        return 0.0
    p_hat, p_keep = counts_arr[keep] / n, p[keep]
    slope, mass = _neyman_pearson(p_hat, p_keep)
    corners = np.concatenate(([0.0], np.cumsum(mass)))
    curve = np.minimum(np.concatenate(([0.0], np.cumsum(slope * mass))), 1.0)
    if target is not None and _cannot_reach(p_hat, p_keep, n, epsilon, target):
        # One piece [0, 1 - eps]: ln M(g(1 - eps), 0) bounds every b, and it is below ``target``.
        return float(log_set_ratio(float(np.interp(1.0 - epsilon, corners, curve)), 0.0, n, epsilon))
    return _relaxed_bound(corners, curve, n, epsilon, target)


#: A check whose e-process has reached threshold ** HOLD_FRACTION (the fourth root of the rejection threshold) holds its
#: case to the cap: the early pass never stops a case while one of its checks holds evidence against its law. A quarter
#: since suite 0.6 (a third before): the faster pass statistic leaves undesigned checks fewer observations.
HOLD_FRACTION = 1 / 4


def hold_level(log_threshold: float) -> float:
    """ln of the e-value at which a check holds its case to the cap: HOLD_FRACTION x ln T (E >= T^(1/4))."""
    return HOLD_FRACTION * log_threshold


def holds_evidence(max_log_e: float, log_threshold: float) -> bool:
    """Whether a check's e-process has reached the fourth root of its rejection threshold T at some batch end
    (``max_log_e``: the running maximum of ln E, ``log_threshold``: ln T), i.e. holds evidence against its null.

    Hypothesis: the check's null. Guarantee: under it, P(sup_n E_n >= T^(1/4)) <= T^(-1/4) by Ville's inequality
    (0.032 per check at T = 1e6; 12 of 6,000 null runs measured at 32 looks, ``bench/suite_power.py --hold-null``), so
    a clean check rarely holds a case, and holding only costs trials. A check that holds is a quarter of the way, on
    the log scale, to a rejection.
    Reference: docs/statistics.md §7a, "Held by evidence"; Ville (1939)."""
    return max_log_e >= hold_level(log_threshold)


def may_stop_early(passed: Iterable[bool], live_max_log_e: Iterable[float], log_threshold: float) -> bool:
    """The early pass's stopping rule for a case at a batch end.

    ``passed``: one flag per watched (designed) check, true once it is done: its pass statistic reached ln(1 / beta_pass),
    it has the observations its design plans (power 1 - beta at TV epsilon, fixed-n), or its layer already failed;
    ``live_max_log_e``: the running maximum of ln E of every check, designed or not, whose layer has not failed;
    ``log_threshold``: ln T of the run.

    Stop iff at least one check is watched, every watched check is done, and no live check holds evidence
    (:func:`holds_evidence`). Guarantee: the rule reads the past only, so the case's run is a prefix of its run to the
    cap; a check at TV >= epsilon is missed only if its pass statistic crossed (<= beta_pass, Ville) or its e-process
    was below the threshold at the first look with its planned observations (<= beta, the design): the miss bound
    beta + beta_pass, the family-wise level and the stopped e-values are unchanged (docs/statistics.md §7a)."""
    flags = list(passed)
    if not flags or not all(flags):
        return False
    return not any(holds_evidence(value, log_threshold) for value in live_max_log_e)
