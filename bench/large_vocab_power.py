"""Is the power table's uniform alternative the hardest for the 50,257-token case? Its real nulls, several alternatives.

The power table (``specwatch/eprocess_power.json``) is simulated with p0 uniform on k cells and the least-favourable
alternative p0 (1 +- 2 eps) on two halves. ``direct/large_vocab/V50257/g1``'s designed checks have other nulls: a
Zipf law on 50,257 cells (``lossless/pos1``; ``lossless/pos2``'s is a permutation of it, the same problem) and the
(accepted, token) law on 77,356 cells (``conformance/pos1``). For each, at TV ``--epsilon`` and the threshold of a
``--tests``-check run at alpha = 1e-4, n = the observations ``stats.plan_test`` gives it (the table's row, support
rounded up), ``--runs`` runs of n observations from each law below, all exactly at TV epsilon from the check's null,
and the suite's own e-value ``stats.log_e_dirichlet_mixture`` against that null. Printed per law: the chi^2 divergence,
misses (log E < log T) and the 0.1 %, 1 % and 50 % quantiles of log E - log T; the table's own alternative on the
rounded-up support (uniform, ``eprocess_simulation``) for comparison. A law whose low quantiles sit above the uniform
row's is easier for the e-process than the alternative the table assumes (computed, not proved).

Laws (S and its complement D get +eps and -eps of mass, each cell in proportion to p0 unless said):
- ``halves``: cells dealt by weight to the lighter side (bench/suite_power.py's least favourable; chi^2 ~ 4 eps^2);
- ``random halves``: cells dealt in a random order until S holds half the mass;
- ``heavy up`` / ``heavy down``: S = the heaviest cells holding half the mass / the lightest;
- ``tail M``: the halves built among the lightest cells holding mass M only (M = 2.1 eps: those cells nearly double or vanish);
- ``spread``: eps taken from the heaviest three quarters of the mass in proportion and given to the lightest cells
  holding the last quarter in equal parts (mass onto rarely seen cells).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python bench/large_vocab_power.py --epsilon 0.1 --tests 211
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.cases import DIRECT_CASES, select
from specwatch.eprocess_power import load_table
from specwatch.eprocess_simulation import simulated_log_e
from specwatch.evidence import designed_checks
from specwatch.sampling import reference_sampler
from specwatch.stats import log_e_dirichlet_mixture, plan_test, rejection_threshold

Law = NDArray[np.float64]


def shifted(p0: Law, up: NDArray[np.bool_], down: NDArray[np.bool_], epsilon: float) -> Law:
    """p0 with +epsilon spread over ``up`` and -epsilon over ``down``, each in proportion to p0: TV exactly epsilon."""
    mass_up, mass_down = float(p0[up].sum()), float(p0[down].sum())
    if epsilon > mass_down:
        raise ValueError("the down side holds less than epsilon")
    p1 = p0.copy()
    p1[up] *= 1.0 + epsilon / mass_up
    p1[down] *= 1.0 - epsilon / mass_down
    return p1


def dealt(p0: Law, order: NDArray[np.int64], *, by_weight: bool) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Two sets of about equal mass from the cells in ``order``: each to the lighter side, or S first up to half."""
    up = np.zeros(len(p0), dtype=bool)
    total = float(p0[order].sum())
    if by_weight:
        mass_up = mass_down = 0.0
        for cell in order:
            if mass_up <= mass_down:
                up[cell], mass_up = True, mass_up + p0[cell]
            else:
                mass_down += p0[cell]
    else:
        up[order[np.cumsum(p0[order]) <= total / 2]] = True
    down = np.zeros(len(p0), dtype=bool)
    down[order] = True
    return up, down & ~up


def alternatives(p0: Law, epsilon: float, rng: np.random.Generator) -> Iterator[tuple[str, Law]]:
    cells = np.flatnonzero(p0 > 0)
    heavy_first = cells[np.argsort(-p0[cells], kind="stable")]
    yield "halves", shifted(p0, *dealt(p0, heavy_first, by_weight=True), epsilon)
    yield "random halves", shifted(p0, *dealt(p0, rng.permutation(cells), by_weight=False), epsilon)
    up, down = dealt(p0, heavy_first, by_weight=False)
    yield "heavy up", shifted(p0, up, down, epsilon)
    yield "heavy down", shifted(p0, down, up, epsilon)
    light_first = heavy_first[::-1]
    for mass in sorted({round(2.1 * epsilon, 6), 0.5}):
        tail = light_first[: int(np.searchsorted(np.cumsum(p0[light_first]), mass)) + 1]
        yield f"tail {mass:g}", shifted(p0, *dealt(p0, tail[::-1], by_weight=True), epsilon)
    tail = light_first[: int(np.searchsorted(np.cumsum(p0[light_first]), 0.25)) + 1]
    spread = np.zeros(len(p0), dtype=bool)
    spread[tail] = True
    p1 = p0.copy()
    head = (p0 > 0) & ~spread
    p1[head] *= 1.0 - epsilon / float(p0[head].sum())
    p1[spread] += epsilon / len(tail)
    yield "spread", p1


def report(name: str, log_e: NDArray[np.float64], log_t: float, chi2: float) -> None:
    margin = log_e - log_t
    q = np.quantile(margin, [0.001, 0.01, 0.5])
    misses = int((margin < 0).sum())
    print(f"  {name:16s} chi2/(4 eps^2) {chi2:6.3f}  misses {misses:>4d}/{len(log_e)}  log E - log T: {q[0]:7.2f} {q[1]:7.2f} {q[2]:7.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epsilon", type=float, default=0.1)
    parser.add_argument("--tests", type=int, default=211, help="checks in the run (Bonferroni m; 211: the reference battery)")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=39)
    args = parser.parse_args(argv)
    threshold = rejection_threshold(1e-4, args.tests)
    log_t, eps = math.log(threshold), args.epsilon
    (case,) = select(["direct/large_vocab/V50257/g1"], DIRECT_CASES)
    experiment = case.build(reference_sampler, torch.device("cpu"))
    supports = sorted({int(r["support"]) for r in load_table()["rows"]})
    rng = np.random.default_rng(args.seed)
    for check in designed_checks(experiment, eps):
        if check.name == "lossless/pos2" or check.support <= 1024:
            continue  # pos2: a permutation of pos1's null; small supports: the table's own range
        n = plan_test(check.support, 1.0, eps, 1.0 / threshold, 1e-3).needed
        rounded = next(k for k in supports if k >= check.support)
        print(f"{check.name}: support {check.support} (table row {rounded}), TV {eps:g}, T {threshold:.3g}, n {n:,}")
        started = time.perf_counter()
        report("uniform (table)", np.concatenate(list(simulated_log_e(rounded, eps, n, args.runs, rng))), log_t, 1.0)
        p0 = check.null
        for name, p1 in alternatives(p0, eps, rng):
            if abs(0.5 * np.abs(p1 - p0).sum() - eps) > 1e-9 or abs(p1.sum() - 1) > 1e-9 or p1.min() < 0:
                raise SystemExit(f"{name}: not a law at TV {eps:g}")
            keep = p0 > 0
            chi2 = float(((p1[keep] - p0[keep]) ** 2 / p0[keep]).sum()) / (4 * eps**2)
            log_e = np.array([log_e_dirichlet_mixture(rng.multinomial(n, p1), p0) for _ in range(args.runs)])
            report(name, log_e, log_t, chi2)
        print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
