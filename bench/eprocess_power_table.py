"""Regenerate ``specwatch/eprocess_power.json``: observations the suite's own e-process needs at TV epsilon.

For each support k, TV epsilon and rejection threshold T the table holds the smallest n on a geometric grid (ratio
``--step``) at which ``stats.log_e_dirichlet_mixture`` -- the very function the suite calls, through
``stats.count_misses`` -- fell below log T in **none** of ``--runs`` runs drawn from the least-favourable
alternative at TV epsilon (``stats.least_favourable``: chi^2 divergence 4 epsilon^2, the least at TV epsilon).
Supports above ``--fast-above`` (1024) are simulated by ``eprocess_simulation.count_misses_by_histogram``: the same
law (by construction) and the same e-value (grouped by count, cross-checked against ``log_e_dirichlet_mixture`` on
every call), about 10 x faster at 65,536 cells; its random stream differs, so rows up to 1024 keep ``count_misses``.

What is proved and what is computed: the sequential test misses by n only if E_n < T, so P(miss by n) <= P(E_n < T)
(proved); zero misses in R runs bounds P(E_n < T) by 1 - 0.05^(1/R) at 95 % confidence (Clopper-Pearson; computed).
The table stores that bound as ``beta_bound``. Seeded: the output is deterministic for a given numpy/scipy.

    PYTHONPATH=$PWD python bench/eprocess_power_table.py > specwatch/eprocess_power.json

Each row is seeded by (seed, support, n) alone, so the grid may be split over processes (``--supports``) and the
rows merged (``--into``). The shipped table holds two grids, listed in its ``grids``:

- supports 2-1024 (powers of 2), epsilon {0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5}, T {1e3, 1e4, 1e5, 1e6, 2e6, 3e6,
  5e6, 1e7, 1e8}: made as five runs (supports 2-256 and 512-1024 at epsilon 0.02-0.1 and T in {1e3, ..., 1e8}
  without 2e6-5e6; every support at T in {2e6, 3e6, 5e6}; supports 2-256 and 512-1024 at epsilon 0.2-0.5 and every
  T; about 20 min in all on two shared cores);
- the large supports of ``--large``, 65,536 and 131,072 cells (the 50,257-token case's checks have 50,257 and 77,356;
  131,072 also covers a 128,256-token vocabulary), epsilon {0.05, 0.1, 0.2, 0.3, 0.5} and T {1e5, 1e6, 2e6, 3e6, 5e6,
  1e7} (a run at alpha = 1e-4 of 10 to 1000 checks; the case alone has 4: T 4e4), merged into the shipped table by
  one command (wall time in docs/statistics.md §7); outside it (epsilon below 0.05, T below 4e4 or above 1e7) the
  lookup falls back:

    PYTHONPATH=$PWD python bench/eprocess_power_table.py --large --into specwatch/eprocess_power.json

``eprocess_power.eprocess_needed`` refuses a grid corner the table lacks (the caller then falls back to Pearson).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from specwatch.eprocess_simulation import count_misses_by_histogram
from specwatch.stats import count_misses

SMALL_GRID = {
    "supports": [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
    "epsilons": [0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5],
    "thresholds": [1e3, 1e4, 1e5, 1e6, 2e6, 3e6, 5e6, 1e7, 1e8],
}
LARGE_GRID = {"supports": [65536, 131072], "epsilons": [0.05, 0.1, 0.2, 0.3, 0.5], "thresholds": [1e5, 1e6, 2e6, 3e6, 5e6, 1e7]}
Counter = Callable[..., int]


def needed(support: int, epsilon: float, threshold: float, runs: int, step: float, seed: int, counter: Counter = count_misses) -> int:
    """Smallest n on the geometric grid with zero misses in ``runs`` runs (a coarse pass, then ``step``)."""

    def clean(n: int) -> bool:
        rng = np.random.default_rng([seed, support, n])
        return counter(support, epsilon, threshold, n=n, runs=runs, rng=rng, stop_at=1) == 0

    n = max(1, math.ceil(math.log(threshold) / (4 * epsilon**2)))
    while not clean(n):  # coarse: doubling-ish
        n = math.ceil(n * 1.3)
    lo = math.ceil(n / 1.3)
    m = lo
    while m < n and not clean(m):
        m = math.ceil(m * step)
    return min(m, n)


def _merge(path: Path, meta: dict[str, Any], rows: list[dict[str, Any]], grid: dict[str, list[Any]]) -> dict[str, Any]:
    """The table at ``path`` with ``rows`` added (a row of the same support, epsilon and threshold replaced) and
    ``grid`` listed; its simulation settings must be these."""
    table: dict[str, Any] = json.loads(path.read_text())
    for key in ("runs", "step", "seed"):
        if table[key] != meta[key]:
            raise SystemExit(f"{path}: {key} {table[key]} differs from this run's {meta[key]}")
    key = lambda r: (r["support"], r["epsilon"], r["threshold"])  # noqa: E731 - a sort and match key
    kept = {key(r): r for r in table["rows"]} | {key(r): r for r in rows}
    grids = [g for g in table.get("grids", [SMALL_GRID]) if g != grid] + [grid]
    return table | {"grids": grids, "rows": [kept[k] for k in sorted(kept)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--supports", default=",".join(map(str, SMALL_GRID["supports"])))
    parser.add_argument("--epsilons", default=",".join(map(str, SMALL_GRID["epsilons"])))
    parser.add_argument("--thresholds", default="1e3,1e4,1e5,1e6,2e6,3e6,5e6,1e7,1e8")
    parser.add_argument("--large", action="store_true", help="the large-support grid (overrides the three above)")
    parser.add_argument("--fast-above", type=int, default=1024, help="simulate larger supports by count histograms")
    parser.add_argument("--into", type=Path, help="merge the rows into this table and write it back (else: stdout)")
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--step", type=float, default=1.05)
    parser.add_argument("--seed", type=int, default=20261205)
    args = parser.parse_args(argv)
    grid = {
        "supports": [int(x) for x in args.supports.split(",")],
        "epsilons": [float(x) for x in args.epsilons.split(",")],
        "thresholds": [float(x) for x in args.thresholds.split(",")],
    }
    grid = LARGE_GRID if args.large else grid
    rows = []
    for k in grid["supports"]:
        counter = count_misses_by_histogram if k > args.fast_above else count_misses
        for eps in grid["epsilons"]:
            for t in grid["thresholds"]:
                n = needed(k, eps, t, args.runs, args.step, args.seed, counter)
                rows.append({"support": k, "epsilon": eps, "threshold": t, "needed": n})
                print(f"k={k} eps={eps} T={t:g}: n={n}", file=sys.stderr, flush=True)
    meta = {"runs": args.runs, "beta_bound": 1.0 - 0.05 ** (1.0 / args.runs), "confidence": 0.95, "step": args.step}
    meta |= {"seed": args.seed, "alternative": "least_favourable: uniform p0, p1 = p0 (1 +- 2 eps) on halves"}
    if args.into is not None:
        args.into.write_text(json.dumps(_merge(args.into, meta, rows, grid), indent=1) + "\n")
        return 0
    json.dump(meta | {"grids": [grid], "rows": rows}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
