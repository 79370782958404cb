"""Regenerate ``specwatch/eprocess_power.json``: observations the suite's own e-process needs at TV epsilon.

For each support k, TV epsilon and rejection threshold T the table holds the smallest n on a geometric grid (ratio
``--step``) at which ``stats.log_e_dirichlet_mixture`` -- the very function the suite calls, through
``stats.count_misses`` -- fell below log T in **none** of ``--runs`` runs drawn from the least-favourable
alternative at TV epsilon (``stats.least_favourable``: chi^2 divergence 4 epsilon^2, the least at TV epsilon).

What is proved and what is computed: the sequential test misses by n only if E_n < T, so P(miss by n) <= P(E_n < T)
(proved); zero misses in R runs bounds P(E_n < T) by 1 - 0.05^(1/R) at 95 % confidence (Clopper-Pearson; computed).
The table stores that bound as ``beta_bound``. Seeded: the output is deterministic for a given numpy/scipy.

    PYTHONPATH=$PWD python bench/eprocess_power_table.py > specwatch/eprocess_power.json

Each row is seeded by (seed, support, n) alone, so the grid may be split over processes (``--supports``) and the
rows merged: the shipped table was made as five runs: supports 2-256 and 512-1024 at epsilon 0.02-0.1 and T in
{1e3, 1e4, 1e5, 1e6, 1e7, 1e8}; every support at T in {2e6, 3e6, 5e6}; supports 2-256 and 512-1024 at epsilon
0.2-0.5 and every T (about 20 min in all on two shared cores).
``stats.plan_test`` needs the full Cartesian grid (``eprocess_power.eprocess_needed`` refuses a missing corner).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

from specwatch.stats import count_misses


def needed(support: int, epsilon: float, threshold: float, runs: int, step: float, seed: int) -> int:
    """Smallest n on the geometric grid with zero misses in ``runs`` runs (a coarse pass, then ``step``)."""

    def clean(n: int) -> bool:
        rng = np.random.default_rng([seed, support, n])
        return count_misses(support, epsilon, threshold, n=n, runs=runs, rng=rng, stop_at=1) == 0

    n = max(1, math.ceil(math.log(threshold) / (4 * epsilon**2)))
    while not clean(n):  # coarse: doubling-ish
        n = math.ceil(n * 1.3)
    lo = math.ceil(n / 1.3)
    m = lo
    while m < n and not clean(m):
        m = math.ceil(m * step)
    return min(m, n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--supports", default="2,4,8,16,32,64,128,256,512,1024")
    parser.add_argument("--epsilons", default="0.02,0.03,0.05,0.1,0.2,0.3,0.5")
    parser.add_argument("--thresholds", default="1e3,1e4,1e5,1e6,2e6,3e6,5e6,1e7,1e8")
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--step", type=float, default=1.05)
    parser.add_argument("--seed", type=int, default=20261205)
    args = parser.parse_args(argv)
    rows = []
    for k in (int(x) for x in args.supports.split(",")):
        for eps in (float(x) for x in args.epsilons.split(",")):
            for t in (float(x) for x in args.thresholds.split(",")):
                n = needed(k, eps, t, args.runs, args.step, args.seed)
                rows.append({"support": k, "epsilon": eps, "threshold": t, "needed": n})
                print(f"k={k} eps={eps} T={t:g}: n={n}", file=sys.stderr, flush=True)
    meta = {"runs": args.runs, "beta_bound": 1.0 - 0.05 ** (1.0 / args.runs), "confidence": 0.95, "step": args.step}
    meta |= {"seed": args.seed, "alternative": "least_favourable: uniform p0, p1 = p0 (1 +- 2 eps) on halves"}
    json.dump(meta | {"rows": rows}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
