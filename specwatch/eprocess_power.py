"""Observations the suite's own e-process needs at TV epsilon, read from a shipped simulation table.

``eprocess_power.json`` is written by ``bench/eprocess_power_table.py``, which runs ``stats.log_e_dirichlet_mixture``
itself on the least-favourable alternative at TV epsilon (docs/statistics.md §7). ``stats.plan_test`` sizes every
designed check from it. What is proved and what is computed: a run that looks at a check when it holds n
observations misses only if E_n < T there, so the fixed-n miss rate at n bounds the miss rate of the running maximum
whatever the other looks (proved); the fixed-n miss rate at the tabulated n is bounded by ``beta_bound`` at 95 %
confidence from zero misses in ``runs`` simulated runs (computed, a Clopper-Pearson bound, not a proof).

The table need not be a full Cartesian grid: it is the union of the grids listed in its ``grids`` (supports 2-1024 at
every tabulated epsilon and threshold; supports 65,536-131,072 at epsilon >= 0.05), and a request whose rounded corner
was not simulated (e.g. epsilon 0.03 on 50,257 cells) gets None, the Pearson fallback, never a neighbour's row.
"""

from __future__ import annotations

import bisect
import functools
import json
from pathlib import Path
from typing import Any

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
    if not any((r["support"], r["epsilon"], r["threshold"]) == (k_up, e_down, t_up) for r in rows):
        return None  # a ragged table: the corner the envelope rounds to was not simulated
    # A monotone envelope: the most any easier-or-equal grid problem needed (smaller support, larger epsilon, lower
    # threshold), so simulation noise between neighbouring rows never lowers the answer.
    return max(int(r["needed"]) for r in rows if r["support"] <= k_up and r["epsilon"] >= e_down and r["threshold"] <= t_up)


def tabulated_epsilons() -> list[float]:
    """The table's TV distances, increasing."""
    return sorted({float(r["epsilon"]) for r in load_table()["rows"]})
