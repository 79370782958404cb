"""The early pass (docs/statistics.md §7a): evidence that a check's observations do not come from a law at TV
distance >= epsilon from its null, so that a clean case can stop before its cap with a proved bound on the misses.

Pure functions over numpy arrays, like :mod:`specwatch.stats`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
from numpy.typing import NDArray
from scipy import special

FloatArray = NDArray[np.float64]


def _kl_below(x: FloatArray | float, y: FloatArray | float) -> FloatArray:
    """Bernoulli kl(x || y) where x < y, else 0: the least KL(P_hat || Q) over Q with Q(A) >= y when P_hat(A) = x."""
    x_arr, y_arr = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    value = special.rel_entr(x_arr, y_arr) + special.rel_entr(1.0 - x_arr, 1.0 - y_arr)
    result: FloatArray = np.where(x_arr < y_arr, value, 0.0)
    return result


def _neyman_pearson(p_hat: FloatArray, p0: FloatArray) -> tuple[FloatArray, FloatArray]:
    """The cells in decreasing order of P_hat / p0: their ratios (the slopes of the Neyman-Pearson curve) and p0
    masses. Through the corners (p0(first j), P_hat(first j)) the curve bounds P_hat(A) <= g(p0(A)) for every set A."""
    ratio = p_hat / p0
    order = np.argsort(-ratio, kind="stable")
    return ratio[order], p0[order]


def _dual_bound(slope: FloatArray, mass: FloatArray, epsilon: float, t: float) -> float:
    """min over b in [0, 1 - epsilon] of -t g(b) - ln(1 - (b + epsilon)(1 - e^-t)) for a t > 0: a lower bound of
    min_b kl(g(b) || b + epsilon)^+ whatever t is (Bernoulli duality, docs/statistics.md §7a).

    ``g`` is the Neyman-Pearson curve of (P_hat, p0), the concave piecewise-linear curve through the points
    (p0(first j cells), P_hat(first j cells)) with cells sorted by ``slope`` = P_hat / p0 decreasing (``mass``: their
    p0). The objective is convex in b, so on each linear piece its minimum is the stationary point clamped to the
    piece: exact and vectorised.
    """
    c = -math.expm1(-t)
    right = np.cumsum(mass)
    left = right - mass
    gain = np.cumsum(slope * mass) - slope * mass  # g at the left end of each piece
    top = 1.0 - epsilon
    live = left <= top
    slope, left, right, gain = slope[live], left[live], np.minimum(right[live], top), gain[live]
    with np.errstate(divide="ignore"):
        stationary = 1.0 / c - 1.0 / (t * slope) - epsilon  # -inf where the slope is 0: the left end
    b = np.clip(stationary, left, right)
    values = -t * (gain + slope * (b - left)) - np.log1p(-(b + epsilon) * c)
    return float(values.min())


def _local_curve(knots: tuple[float, float, float], heights: tuple[float, float, float]) -> Callable[[float], float]:
    """The curve through (knots[i], heights[i]), linear on each side of the middle knot."""
    (b0, b1, b2), (g0, g1, g2) = knots, heights

    def g(b: float) -> float:
        if b <= b1:
            return g1 if b1 <= b0 else g0 + (g1 - g0) * (b - b0) / (b1 - b0)
        return g1 if b2 <= b1 else g1 + (g2 - g1) * (b - b1) / (b2 - b1)

    return g


def _kl_below_scalar(x: float, y: float) -> float:
    if x >= y:
        return 0.0
    return (x * math.log(x / y) if x > 0 else 0.0) + (1.0 - x) * math.log((1.0 - x) / (1.0 - y))


def _golden_min(f: Callable[[float], float], lo: float, hi: float, iterations: int = 64) -> float:
    """A minimiser of a convex ``f`` on [lo, hi] by golden-section search (to about 1e-13 of the bracket)."""
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, d = lo, hi
    b, c = d - ratio * (d - a), a + ratio * (d - a)
    fb, fc = f(b), f(c)
    for _ in range(iterations):
        if fb <= fc:
            d, c, fc = c, b, fb
            b = d - ratio * (d - a)
            fb = f(b)
        else:
            a, b, fb = b, c, fc
            c = a + ratio * (d - a)
            fc = f(c)
    return b if fb <= fc else c


#: The binary bound's branch and bound: pieces of [0, 1 - epsilon] to start from, rounds of halving, most pieces.
BINARY_PIECES, BINARY_ROUNDS, BINARY_MOST = 32, 40, 1 << 14


def _kl(x: FloatArray, y: FloatArray | float) -> FloatArray:
    """Bernoulli kl(x || y), elementwise (inf where x > 0 = y or x < 1 = y)."""
    result: FloatArray = np.asarray(special.rel_entr(x, y) + special.rel_entr(1 - x, 1 - y), dtype=np.float64)
    return result


def _binary_piece_bounds(
    lo: FloatArray, hi: FloatArray, curve: Callable[[FloatArray], FloatArray], slope: float, epsilon: float
) -> FloatArray:
    """Lower bounds of F(g(b), b) = kl(g(b) || b + eps)^+ - kl(g(b) || b) on each [lo, hi] (docs/statistics.md §7a).

    F decreases in its first argument and g increases, so F(g(b), b) >= F(g(hi), b); then kl(x || b + eps)^+ is
    at least its value at lo and kl(x || b), convex in b, at most its larger end value. On a first piece [0, hi]
    (where kl(x || 0) is infinite) g(b) <= slope * b gives slope hi ln(hi / (hi + eps)) + (1 - slope hi) ln(1 / (1 - eps))
    while slope hi <= 1 and (slope - 1) hi <= eps; -inf otherwise (the piece is split until it holds).
    """
    x = curve(hi)
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(x < lo + epsilon, _kl(x, lo + epsilon), 0.0)
        fit = np.maximum(_kl(x, lo), _kl(x, hi))
        bound = np.where(np.isnan(gain - fit), -np.inf, gain - fit)
        first = slope * hi * np.log(hi / (hi + epsilon)) - (1 - slope * hi) * math.log1p(-epsilon)
    usable = (lo <= 0) & (slope * hi <= 1) & ((slope - 1) * hi <= epsilon) & (hi > 0)
    result: FloatArray = np.where(usable, np.maximum(bound, first), bound)
    return result


def _binary_bound(corners: FloatArray, heights: FloatArray, slope: float, epsilon: float, level: float | None) -> float:
    """A lower bound of min over b in [0, 1 - eps] of kl(g(b) || b + eps)^+ - kl(g(b) || b), by branch and bound:
    every piece's bound is valid, so the smallest is, at any round. It refines until the bound reaches ``level`` or a
    point shows that it cannot (then the bound is below ``level`` too); with no ``level``, towards the minimum."""

    def curve(b: FloatArray) -> FloatArray:
        result: FloatArray = np.interp(b, corners, heights)
        return result

    top = 1.0 - epsilon
    edges = np.unique(np.concatenate((np.linspace(0.0, top, BINARY_PIECES + 1), corners[corners < top])))
    lo, hi = edges[:-1], edges[1:]
    upper, bound = math.inf, -math.inf
    for _ in range(BINARY_ROUNDS):
        bounds = _binary_piece_bounds(lo, hi, curve, slope, epsilon)
        mid = (lo + hi) / 2
        x = curve(mid)
        with np.errstate(divide="ignore", invalid="ignore"):
            values = np.where(x < mid + epsilon, _kl(x, mid + epsilon), 0.0) - _kl(x, mid)
        upper = min(upper, float(np.nanmin(values)))
        bound = float(bounds.min())
        goal = upper if level is None else min(upper, level)
        if bound >= goal - 1e-9 * max(1.0, abs(goal)) or (level is not None and upper < level) or 2 * len(lo) > BINARY_MOST:
            break
        split = bounds < goal
        middle = mid[split]
        lo, hi = np.concatenate((lo[split], middle)), np.concatenate((middle, hi[split]))
    return bound


def _cannot_reach(p_hat: FloatArray, p0: FloatArray, epsilon: float, level: float) -> bool:
    """True when T_n / n is below ``level`` at the set A = {P_hat > p0} (T_n is a minimum over sets, so it is below
    too): a cheap O(k) test that spares large supports, which the overfitting keeps from passing, the full bound."""
    above = p_hat > p0
    a, b = float(p_hat[above].sum()), float(p0[above].sum())
    if b + epsilon > 1.0:
        return False
    gain = float(_kl(np.array(a), b + epsilon)) if a < b + epsilon else 0.0
    return gain - float(_kl(np.array(a), b)) < level


def log_pass_statistic(counts: NDArray[np.integer], p0: NDArray[np.floating], epsilon: float, *, target: float | None = None) -> float:
    """Log of the early-pass statistic: evidence that the observations do NOT come from a law at TV >= epsilon.

    H_eps (what it tests, "a bug of size epsilon"): some fixed set A of cells receives, at every observation given
    everything before it, probability >= p0(A) + epsilon; i.i.d. observations from any Q with TV(Q, p0) >= epsilon
    are the main case. Guarantee: under H_eps, P(sup_n exp(statistic_n) >= 1/b) <= b for every b (Ville 1939), so
    passing when it reaches ln(1/b), at batch ends or at any stopping times, misses such a bug with probability at
    most b. The statistic is the larger of two lower bounds of the binary statistic
    T_n = n min_A [kl(P_hat(A) || p0(A) + eps)^+ - kl(P_hat(A) || p0(A))], itself at least the universal-inference
    log ratio ln prod p0(x_i) / sup_{Q in H_eps} prod Q(x_i) = n [min_A kl(P_hat(A) || p0(A) + eps)^+ - KL(P_hat || p0)]
    (Wasserman, Ramdas & Balakrishnan 2020) and at most the log likelihood ratio of the bug's own set A, a test
    supermartingale: the minima over sets relaxed to the Neyman-Pearson curve, the universal-inference one bounded
    by Bernoulli duality (any dual point is valid: the optimiser only buys power), the binary one by branch and bound
    (any stage is valid), refined until it reaches ``target`` or shows that it cannot (None: towards its minimum; a
    statistic that one set shows cannot reach ``target`` is returned as its crudest bound, -n KL(P_hat || p0)).
    -inf after a support violation. docs/statistics.md §7a.
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
    kl_null = float(special.rel_entr(p_hat, p_keep).sum())
    if target is not None and _cannot_reach(p_hat, p_keep, epsilon, target / n):
        return -n * kl_null  # valid (the bound 0 on the minimum) and below ``target``: no need to refine
    slope, mass = _neyman_pearson(p_hat, p_keep)
    corners = np.concatenate(([0.0], np.cumsum(mass)))
    curve = np.minimum(np.concatenate(([0.0], np.cumsum(slope * mass))), 1.0)
    top = 1.0 - epsilon
    grid = np.concatenate((corners[corners < top], [top]))
    heights = np.interp(grid, corners, curve)
    j = int(np.argmin(_kl_below(heights, grid + epsilon)))
    # The relaxed objective is convex in b: its minimiser lies between the grid points around the best one, where
    # the curve is linear on each side.
    around = (max(j - 1, 0), j, min(j + 1, len(grid) - 1))
    g = _local_curve((grid[around[0]], grid[j], grid[around[2]]), (heights[around[0]], heights[j], heights[around[2]]))
    b = _golden_min(lambda b: _kl_below_scalar(g(b), b + epsilon), float(grid[around[0]]), float(grid[around[2]]))
    x, y = g(b), b + epsilon
    universal = -n * kl_null  # x >= y: a law of H_eps fits the data as well as any (the bound 0)
    if x < y:
        t = min(50.0, math.log(y * (1.0 - x) / (max(x, 1e-300) * (1.0 - y))))  # the Bernoulli dual point of kl(x || y)
        universal += n * max(0.0, _dual_bound(slope, mass, epsilon, t) if -math.expm1(-t) > 0.0 else 0.0)  # t = 0 bounds by 0
    if target is not None and universal >= target:
        return universal
    return max(universal, n * _binary_bound(corners, curve, float(slope[0]), epsilon, None if target is None else target / n))


#: A check whose e-process has reached threshold ** HOLD_FRACTION (the cube root of the rejection threshold) holds its
#: case to the cap: the early pass never stops a case while one of its checks holds evidence against its law.
HOLD_FRACTION = 1 / 3


def hold_level(log_threshold: float) -> float:
    """ln of the e-value at which a check holds its case to the cap: HOLD_FRACTION x ln T (E >= T^(1/3))."""
    return HOLD_FRACTION * log_threshold


def holds_evidence(max_log_e: float, log_threshold: float) -> bool:
    """Whether a check's e-process has reached the cube root of its rejection threshold T at some batch end
    (``max_log_e``: the running maximum of ln E, ``log_threshold``: ln T), i.e. holds evidence against its null.

    Hypothesis: the check's null. Guarantee: under it, P(sup_n E_n >= T^(1/3)) <= T^(-1/3) by Ville's inequality
    (1e-2 per check at T = 1e6; 3 of 6,000 null runs measured at 32 looks, ``bench/suite_power.py --hold-null``), so a
    clean check rarely holds a case, and holding only costs trials. A check that holds is a third of the way, on the
    log scale, to a rejection.
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
