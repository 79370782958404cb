"""Observations the suite's own e-process needs at TV epsilon, read from a shipped simulation table.

``eprocess_power.json`` is written by ``bench/eprocess_power_table.py``, which runs ``stats.log_e_dirichlet_mixture``
itself on the least-favourable alternative at TV epsilon (docs/statistics.md §7, "Sizing from the e-process's own
power"). What is proved and what is computed: the sequential test misses by n only if E_n < T, so the fixed-n miss
rate bounds the sequential one (proved); the fixed-n miss rate at the tabulated n is bounded by ``beta_bound`` at
95 % confidence from zero misses in ``runs`` simulated runs (computed, a Clopper-Pearson bound, not a proof).
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from specwatch.stats import log_e_dirichlet_mixture

TABLE_PATH = Path(__file__).with_name("eprocess_power.json")


@functools.cache
def load_table() -> dict[str, Any]:
    """The shipped table: ``rows`` of support, epsilon, threshold, needed; ``runs`` and ``beta_bound``."""
    data: dict[str, Any] = json.loads(TABLE_PATH.read_text())
    return data


def eprocess_needed(support: int, epsilon: float, threshold: float, beta: float) -> int | None:
    """Observations after which the e-process crosses ``threshold`` except with probability <= ``beta`` at TV ``epsilon``.

    Conservative lookup, never interpolated downward: the next tabulated support >= ``support``, the next tabulated
    threshold >= ``threshold`` and the largest tabulated epsilon <= ``epsilon`` (unscaled: it needs more observations),
    and of those the largest n any grid problem at most as hard needed (a monotone envelope over simulation noise).
    None when the request lies outside the table (support or threshold above its largest entry, epsilon below its
    smallest, or ``beta`` below the table's ``beta_bound``): the caller then keeps the Pearson design.
    """
    if support < 1 or epsilon <= 0 or threshold <= 1 or not 0 < beta < 1:
        raise ValueError("support >= 1, epsilon > 0, threshold > 1 and beta in (0, 1) are required")
    table = load_table()
    if beta < float(table["beta_bound"]):
        return None
    rows: list[dict[str, float]] = table["rows"]
    supports = sorted({int(r["support"]) for r in rows})
    epsilons = sorted({float(r["epsilon"]) for r in rows})
    thresholds = sorted({float(r["threshold"]) for r in rows})
    i_k = bisect.bisect_left(supports, support)
    i_t = bisect.bisect_left(thresholds, threshold * (1 - 1e-12))
    i_e = bisect.bisect_right(epsilons, epsilon * (1 + 1e-12)) - 1
    if i_k == len(supports) or i_t == len(thresholds) or i_e < 0:
        return None
    k_up, e_down, t_up = supports[i_k], epsilons[i_e], thresholds[i_t]
    # A monotone envelope: the most any easier-or-equal grid problem needed (smaller support, larger epsilon, lower
    # threshold), so simulation noise between neighbouring rows never lowers the answer.
    return max(int(r["needed"]) for r in rows if r["support"] <= k_up and r["epsilon"] >= e_down and r["threshold"] <= t_up)


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
