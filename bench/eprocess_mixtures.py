"""Which e-process needs the fewest observations? The suite's kappa grid against other mixtures and predictable plug-ins.

Issue 39 item 3. Every candidate below is a test martingale (or, for the split likelihood ratio, an e-value at each
fixed n) for H0: the observations are i.i.d. from p0, so each is valid by construction; the script also measures
the false-alarm rate under H0 at small thresholds (``--validity``). It asserts nothing: it prints figures.

Candidates (k = number of cells of p0; ``E_n(kappa)`` = the Dirichlet(kappa p0)-multinomial predictive likelihood
ratio against p0 after n observations, ``stats.log_e_dirichlet_mixture`` with one kappa):

- ``grid27`` (the suite's, ``stats.KAPPA_GRID``): mean of E_n(kappa) over kappa = 2^0 .. 2^26. Each E_n(kappa) is a
  test martingale (sequential posterior-predictive over p0); a fixed-weight average of test martingales is one.
- ``dense53``, ``narrow21``, ``k-grid15``, ``k-grid8``, ``k-half``: other FIXED weights over kappa (denser: 2^(j/2);
  narrower: 2^0 .. 2^20; scaled by the support: k 2^j for j = -4..10 or 2..9; half of the mass on k 2^(2..9) and half
  on the suite's grid, i.e. prior mass kept on small kappa). Weights may depend on p0 (hence on k), never on the
  data: valid for the same reason as ``grid27``. These are functions of the counts alone, so the runner
  (``evidence.CaseEvidence.add``, which passes the cumulative counts of a check to one function) can use them as is.
  Why k 2^j: a Gaussian approximation of log E_n(kappa) is (1/2) n/(n+kappa) X^2 - (k-1)/2 ln(1 + n/kappa) (X^2:
  Pearson), maximised at kappa ~ (k-1)/chi^2(p1||p0) = (k-1)/(4 eps^2) under the least-favourable alternative:
  the best kappa scales with the support and not with n.
- ``plugin-mix`` (a predictable plug-in, Waudby-Smith & Ramdas 2024 / Shekhar & Ramdas 2023 style): the product over
  batches b of prod_{x in b} q_b(x)/p0(x) with q_b = (N + c p0)/(n + c) from the counts at the batch START, frozen
  within the batch; averaged over c in k 2^{1,3,5,7,9}. Each factor has mean 1 given the past under H0 (q_b is fixed
  before the batch is drawn), so each c gives a test martingale at every observation, and their average is one.
  Updated observation by observation instead of per batch, the plug-in with one c IS E_n(kappa = c); betting
  1 + lambda (q/p0 - 1) is the same plug-in with q shrunk to lambda q + (1 - lambda) p0. Batch counts suffice (the
  batch's counts and the counts before it), but the value depends on where the batches ended: the runner would
  have to keep it per check (``evidence.py`` recomputes from the cumulative counts: not usable without changing it).
- ``ftl-kappa`` (a predictable choice of kappa, follow-the-leader): for each batch, the kappa of the suite's grid with
  the largest E at the batch start (before any data: k 2^5); the batch contributes E_end(kappa_b) / E_start(kappa_b),
  the Dirichlet predictive of the batch given the past, a product of per-observation factors of mean 1 under H0.
  A test martingale; computable from the counts at batch ends, but again stateful (depends on the batch ends).
- ``split-LR`` (universal inference, Wasserman, Ramdas & Balakrishnan 2020): at a look n_j, the counts up to the look
  four looks back (n_j / 2 at the default ratio) fit q = (N + c p0)/(n + c), averaged over the same c; the rest are
  scored by prod q(x)/p0(x). An e-value at each fixed n only (the suite's running maximum over looks is not covered):
  reported for the fixed-n metric, not the sequential one.
- ``oracle-LR`` (a reference, not a candidate): prod p1(x)/p0(x), Wald's likelihood ratio for the TRUE alternative,
  which no check knows. The GROW-optimal e-process against that single p1: roughly the ceiling of what any
  e-process, however tuned, could save on that alternative (in expected time; at a 0.1 % quantile a mixture,
  convex in the counts, can do as well).
- ``hindsight-max`` (a reference, not a candidate): max over kappa (2^(j/2), j = -8..52) of E_n(kappa), the best
  single kappa chosen after seeing the data. Not an e-process, but at least as large as every fixed-weight mixture
  over those kappas: no reweighting of the grid can need fewer observations than it.

Metrics, per support k, TV eps and alternative, threshold T (default 2e6, the default profile's ~2.1e6):

- ``fixed-n``: the n at which the empirical 0.1 % quantile of log E_n crosses log T (so at most beta = 1e-3 of runs
  miss at that n), interpolated log-linearly between looks, with a 95 % interval from the order statistics of the
  quantile (binomial(runs, 1e-3) ranks 2.5 % and 97.5 %). ``bench/eprocess_power_table.py`` instead takes the first n
  with zero misses in 3000 runs, a noisier estimate of about the same quantile. Path-dependent candidates are
  evaluated at the looks of their own batch schedule.
- ``E[first]``: the mean number of observations at the first look with log E >= log T (looks at n_j = ceil(8 r^j),
  r = ``--look-ratio``, default 2^(1/4); runs never crossing by the last look count as the last look and are
  reported). The runner's looks are coarser (batches doubling to cap/32), which helps no candidate.

Alternatives (``stats.least_favourable`` is the one the power table uses):

- ``lf``: p0 uniform, p1 = p0 (1 +- 2 eps) on halves (chi^2 = 4 eps^2, the least at TV eps).
- ``zipf-tail``: p0 proportional to 1/i; the tail (the least likely cells after half the mass) gains eps in proportion
  to p0, the head loses it likewise.
- ``one-cell``: p0 Zipf; the least likely cell gains eps, every other cell loses in proportion to p0.

The same random draws feed every candidate (common random numbers), so differences between candidates are sharper
than each interval. Seeded by (``--seed``, k, eps, alternative). The figures in docs/statistics.md (§4, "The mixture,
reconsidered") came from these three runs, one after the other on a loaded two-core machine (13.5, about 20 and
5 min)::

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD nice -n 15 .venv/bin/python bench/eprocess_mixtures.py --supports 2,16,256 --runs 20000
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD nice -n 15 .venv/bin/python bench/eprocess_mixtures.py --supports 1024 --runs 10000
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD nice -n 15 .venv/bin/python bench/eprocess_mixtures.py --validity --validity-runs 20000
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np
from scipy import sparse, special, stats

from specwatch.stats import KAPPA_GRID, least_favourable, log_e_dirichlet_mixture, pearson_sample_size

#: log2 of every kappa any candidate uses: 2^(j/2) for j = -8 .. 52 (k 2^j for k = 2 .. 1024 and j = -4 .. 10 included).
MASTER_HALF_LOG2 = np.arange(-8, 53)
MASTER = 2.0 ** (MASTER_HALF_LOG2 / 2.0)
C_LOG2 = (1, 3, 5, 7, 9)  # plug-in shrinkages c = k 2^j
BETA = 1e-3


def master_index(kappas: np.ndarray) -> np.ndarray:
    idx = np.rint(2 * np.log2(kappas)).astype(int) - MASTER_HALF_LOG2[0]
    if not np.allclose(MASTER[idx], kappas):
        raise ValueError("kappa not on the master grid")
    return idx


def mixtures(k: int) -> dict[str, np.ndarray]:
    """Fixed log-weights over MASTER for every count-only candidate (-inf: not in the prior)."""
    out: dict[str, np.ndarray] = {}

    def uniform(kappas: np.ndarray) -> np.ndarray:
        w = np.full(len(MASTER), -np.inf)
        w[master_index(kappas)] = -math.log(len(kappas))
        return w

    out["grid27"] = uniform(KAPPA_GRID)
    out["dense53"] = uniform(2.0 ** (np.arange(0, 53) / 2.0))
    out["narrow21"] = uniform(2.0 ** np.arange(0, 21.0))
    out["k-grid15"] = uniform(k * 2.0 ** np.arange(-4, 11.0))
    out["k-grid8"] = uniform(k * 2.0 ** np.arange(2, 10.0))
    out["k-half"] = np.logaddexp(out["k-grid8"], out["grid27"]) - math.log(2)
    return out


def per_kappa_log_e(counts: np.ndarray, p0: np.ndarray) -> np.ndarray:
    """log E_n(kappa) for every row of ``counts`` (runs x cells) and every kappa of MASTER: runs x kappas.

    The formula of ``stats.log_e_dirichlet_mixture`` per kappa; the cell terms depend on (p0 of the cell, its count)
    alone, so they are tabulated once per distinct pair and summed per run by a product with each run's
    histogram of pairs (dense when p0 has few distinct values, as a uniform p0 has, else sparse).
    """
    runs, k = counts.shape
    n = counts.sum(axis=1).astype(np.float64)
    levels, group = np.unique(p0, return_inverse=True)
    lo = np.array([counts[:, group == g].min() for g in range(len(levels))])
    hi = np.array([counts[:, group == g].max() for g in range(len(levels))])
    width = hi - lo + 1
    offset = np.concatenate([[0], np.cumsum(width)[:-1]])
    size = int(width.sum())
    level = np.repeat(np.arange(len(levels)), width)
    count = (np.arange(size) - offset[level] + lo[level]).astype(np.float64)
    a = MASTER[None, :] * levels[level][:, None]
    table = special.gammaln(count[:, None] + a) - special.gammaln(a) - (count * np.log(levels[level]))[:, None]
    keys = offset[group][None, :] + counts - lo[group][None, :]
    if runs * size <= 5e7:
        flat = (keys + size * np.arange(runs)[:, None]).ravel()
        hist = np.bincount(flat, minlength=runs * size).reshape(runs, size).astype(np.float64)
        summed = hist @ table
    else:
        m = sparse.csr_matrix((np.ones(runs * k), keys.ravel(), np.arange(0, runs * k + 1, k)), shape=(runs, size))
        summed = np.asarray(m @ table)
    return summed + special.gammaln(MASTER)[None, :] - special.gammaln(n[:, None] + MASTER[None, :])


def alternative(name: str, k: int, eps: float) -> tuple[np.ndarray, np.ndarray]:
    if name == "lf":
        return least_favourable(k, eps)
    p0 = 1.0 / np.arange(1, k + 1)
    p0 /= p0.sum()
    if name == "zipf-tail":
        head = np.cumsum(p0) < 0.5
        head[0] = True
        mass_head = p0[head].sum()
        p1 = np.where(head, p0 * (1 - eps / mass_head), p0 * (1 + eps / (1 - mass_head)))
    elif name == "one-cell":
        p1 = p0 * (1 - eps / (1 - p0[-1]))
        p1[-1] = p0[-1] + eps
    else:
        raise ValueError(name)
    return p0, p1


@dataclass
class PathState:
    """Per-run state of the batch-level (path-dependent) candidates."""

    plug: np.ndarray  # runs x len(C_LOG2): log of each frozen plug-in process
    ftl: np.ndarray  # runs: log of the follow-the-leader process
    ftl_choice: np.ndarray  # runs: MASTER index of the kappa chosen for the current batch
    last: np.ndarray  # runs x kappas: log E_n(kappa) at the previous look
    history: list[np.ndarray]  # counts at the last four looks (for the split LR)


def log_ratio_plugin(prev: np.ndarray, n_prev: int, p0: np.ndarray, c: float) -> np.ndarray:
    return np.log((prev + c * p0[None, :]) / (p0[None, :] * (n_prev + c)))


def look_values(
    counts: np.ndarray,
    prev: np.ndarray,
    n_prev: int,
    p0: np.ndarray,
    p1: np.ndarray,
    state: PathState,
    weights: dict[str, np.ndarray],
    lag: int,
) -> dict[str, np.ndarray]:
    """log E of every candidate at one look (``counts``), given the counts at the previous look (``prev``)."""
    k = len(p0)
    inc = counts - prev
    L = per_kappa_log_e(counts, p0)
    values = {name: special.logsumexp(L + w[None, :], axis=1) for name, w in weights.items()}
    for j, c_log2 in enumerate(C_LOG2):
        state.plug[:, j] += (inc * log_ratio_plugin(prev, n_prev, p0, k * 2.0**c_log2)).sum(axis=1)
    values["plugin-mix"] = special.logsumexp(state.plug, axis=1) - math.log(len(C_LOG2))
    values["plugin-c=k*32"] = state.plug[:, C_LOG2.index(5)].copy()
    rows = np.arange(len(counts))
    state.ftl += L[rows, state.ftl_choice] - state.last[rows, state.ftl_choice]
    state.last = L
    values["ftl-kappa"] = state.ftl.copy()
    grid = master_index(KAPPA_GRID)
    state.ftl_choice = grid[np.argmax(L[:, grid], axis=1)]
    state.history.append(counts)
    if len(state.history) > lag + 1:
        state.history.pop(0)
    if len(state.history) == lag + 1:
        fit = state.history[0]
        n_fit = int(fit[0].sum())
        parts = [((counts - fit) * log_ratio_plugin(fit, n_fit, p0, k * 2.0**c)).sum(axis=1) for c in C_LOG2]
        values["split-LR"] = special.logsumexp(np.stack(parts, axis=1), axis=1) - math.log(len(C_LOG2))
    else:
        values["split-LR"] = np.zeros(len(counts))
    values["oracle-LR"] = counts @ np.log(p1 / p0)
    values["hindsight-max"] = L.max(axis=1)
    return values


SEQUENTIAL_INVALID = {"split-LR"}  # an e-value at each fixed n, not an e-process: no first-crossing figure
REFERENCE = {"oracle-LR", "hindsight-max"}  # know p1 or look back: ceilings, not candidates


def simulate(
    p0: np.ndarray, p1: np.ndarray, log_t: float, runs: int, ratio: float, rng: np.random.Generator, max_looks: int = 90
) -> tuple[list[int], dict[str, list[np.ndarray]]]:
    """Draw ``runs`` paths of p1 observed at geometric looks until every candidate's 0.1 % quantile and every
    sequential candidate's every run crossed log T (or ``max_looks``): the looks and log E per candidate per look."""
    k = len(p0)
    weights = mixtures(k)
    lag = max(1, round(math.log(2) / math.log(ratio)))
    first_kappa = master_index(np.array([k * 32.0]))[0]
    state = PathState(np.zeros((runs, len(C_LOG2))), np.zeros(runs), np.full(runs, first_kappa), np.zeros((runs, len(MASTER))), [])
    counts = np.zeros((runs, k), dtype=np.int64)
    looks: list[int] = []
    trace: dict[str, list[np.ndarray]] = {}
    low_rank = max(1, int(stats.binom.ppf(0.025, runs, BETA)))  # the interval's lower rank must cross too
    n_prev, j = 0, 0
    while len(looks) < max_looks:
        n = math.ceil(8 * ratio**j)
        j += 1
        if n == n_prev:
            continue
        prev = counts
        counts = prev + rng.multinomial(n - n_prev, p1, size=runs)
        for name, v in look_values(counts, prev, n_prev, p0, p1, state, weights, lag).items():
            trace.setdefault(name, []).append(v)
        looks.append(n)
        n_prev = n
        q_done = all(np.sort(v[-1])[low_rank - 1] >= log_t for v in trace.values())
        seq_done = all(np.max(trace[c], axis=0).min() >= log_t for c in trace if c not in SEQUENTIAL_INVALID)
        if q_done and seq_done:
            break
    return looks, trace


def crossing(looks: list[int], values: np.ndarray, log_t: float) -> float:
    """n at which ``values`` (one per look) first reaches log T, log-linear between looks; inf if never."""
    above = np.flatnonzero(values >= log_t)
    if not len(above):
        return math.inf
    i = int(above[0])
    if i == 0:
        return float(looks[0])
    x0, x1, y0, y1 = math.log(looks[i - 1]), math.log(looks[i]), values[i - 1], values[i]
    return math.exp(x0 + (log_t - y0) / (y1 - y0) * (x1 - x0))


def summarise(looks: list[int], trace: list[np.ndarray], log_t: float, sequential: bool) -> dict[str, float]:
    """Fixed-n needed at the 0.1 % quantile with its 95 % interval; mean first crossing and runs that never crossed."""
    m = np.stack(trace)  # looks x runs
    runs = m.shape[1]
    ordered = np.sort(m, axis=1)
    rank = max(1, math.ceil(BETA * runs))
    lo_rank = max(1, int(stats.binom.ppf(0.025, runs, BETA)))
    hi_rank = min(runs, int(stats.binom.ppf(0.975, runs, BETA)) + 1)
    out = {
        "needed": crossing(looks, ordered[:, rank - 1], log_t),
        "needed_lo": crossing(looks, ordered[:, hi_rank - 1], log_t),
        "needed_hi": crossing(looks, ordered[:, lo_rank - 1], log_t),
    }
    if sequential:
        hit = m >= log_t
        crossed = hit.any(axis=0)
        first = np.where(crossed, np.asarray(looks)[np.argmax(hit, axis=0)], looks[-1])
        out |= {"mean_first": float(first.mean()), "se_first": float(first.std(ddof=1) / math.sqrt(runs))}
        out["uncrossed"] = float((~crossed).mean())
    return out


ALTERNATIVES = ("lf", "zipf-tail", "one-cell")


def self_check(rng: np.random.Generator) -> float:
    """Largest |difference| between ``grid27`` computed here and ``stats.log_e_dirichlet_mixture`` (the suite's)."""
    worst = 0.0
    for k in (2, 16, 256):
        for alt in ALTERNATIVES:
            p0, p1 = alternative(alt, k, 0.05)
            counts = rng.multinomial(3000, p1, size=8)
            mine = special.logsumexp(per_kappa_log_e(counts, p0) + mixtures(k)["grid27"][None, :], axis=1)
            suite = np.array([log_e_dirichlet_mixture(row, p0) for row in counts])
            worst = max(worst, float(np.abs(mine - suite).max()))
    return worst


def scenario(k: int, eps: float, alt: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng([args.seed, k, round(eps * 1e4), ALTERNATIVES.index(alt)])
    p0, p1 = alternative(alt, k, eps)
    log_t = math.log(args.threshold)
    start = time.perf_counter()
    looks, trace = simulate(p0, p1, log_t, args.runs, args.look_ratio, rng)
    rows = {name: summarise(looks, trace[name], log_t, name not in SEQUENTIAL_INVALID) for name in trace}
    chi2 = float(((p1 - p0) ** 2 / p0).sum())
    pearson = pearson_sample_size(k, eps, 1 / args.threshold, BETA) * 4 * eps**2 / chi2
    print(
        f"\nk={k} eps={eps} {alt}: chi2={chi2:.4g}, {args.runs} runs, {len(looks)} looks to n={looks[-1]}, "
        f"{time.perf_counter() - start:.0f} s; Pearson fixed-n at level 1/T (asymptotic, not anytime-valid): {pearson:,.0f}",
        flush=True,
    )
    base = rows["grid27"]
    print(f"  {'candidate':14s} {'fixed-n needed [95 %]':>28s} {'/grid27':>8s} {'E[first] +- se':>20s} {'/grid27':>8s} {'never':>6s}")
    for name, r in rows.items():
        interval = f"{r['needed']:,.0f} [{r['needed_lo']:,.0f}, {r['needed_hi']:,.0f}]"
        line = f"  {name:14s} {interval:>28s} {r['needed'] / base['needed']:8.3f}"
        if "mean_first" in r:
            ratio = r["mean_first"] / base["mean_first"]
            line += f" {r['mean_first']:>12,.0f} +- {r['se_first']:<5,.0f} {ratio:8.3f} {r['uncrossed']:6.4f}"
        print(line, flush=True)
    return rows


def summary(results: dict[tuple[int, float, str], dict[str, dict[str, float]]]) -> None:
    """Ratios to the suite's grid per scenario, and each candidate's best and worst ratio."""
    names = list(next(iter(results.values())))
    for metric in ("needed", "mean_first"):
        print(f"\n{metric} / grid27's (rows: k, eps, alternative)")
        cols = [n for n in names if metric in results[next(iter(results))][n]]
        print(f"  {'scenario':22s}" + "".join(f"{n:>14s}" for n in cols))
        for (k, eps, alt), rows in results.items():
            print(f"  {f'{k} {eps} {alt}':22s}" + "".join(f"{rows[n][metric] / rows['grid27'][metric]:14.3f}" for n in cols))
        for label, fn in (("best", min), ("worst", max)):
            print(f"  {label:22s}" + "".join(f"{fn(r[n][metric] / r['grid27'][metric] for r in results.values()):14.3f}" for n in cols))


def validity(args: argparse.Namespace) -> None:
    """False alarms under H0 at thresholds 20 and 100 (Ville: at most 1/T), looks as above up to n = 8 r^44."""
    print(f"\nH0 false alarms, {args.validity_runs} runs, sequential looks (running maximum over looks), bound 1/T")
    for k in (2, 16, 256):
        for alt in ("lf", "zipf-tail"):
            p0, _ = alternative(alt, k, 0.05)
            rng = np.random.default_rng([args.seed, k, 7, ALTERNATIVES.index(alt)])
            looks, trace = simulate(p0, p0, math.inf, args.validity_runs, args.look_ratio, rng, max_looks=45)
            print(f"  k={k} p0={'uniform' if alt == 'lf' else 'zipf'} looks to n={looks[-1]}", flush=True)
            for name, values in trace.items():
                if name in SEQUENTIAL_INVALID | REFERENCE:
                    continue
                peak = np.max(np.stack(values), axis=0)
                cells = []
                for t in (20.0, 100.0):
                    hits = int((peak >= math.log(t)).sum())
                    hi = float(stats.beta.ppf(0.975, hits + 1, args.validity_runs - hits))
                    cells.append(f"T={t:g}: {hits}/{args.validity_runs} (<= {hi:.4f})")
                print(f"    {name:14s} " + "   ".join(cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--supports", default="2,16,256,1024")
    parser.add_argument("--epsilons", default="0.05,0.1")
    parser.add_argument("--alternatives", default=",".join(ALTERNATIVES))
    parser.add_argument("--threshold", type=float, default=2e6)
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--look-ratio", type=float, default=2**0.25)
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--validity", action="store_true", help="only the false-alarm check under H0")
    parser.add_argument("--validity-runs", type=int, default=20000)
    args = parser.parse_args(argv)
    print(f"self-check: |grid27 here - stats.log_e_dirichlet_mixture| <= {self_check(np.random.default_rng(args.seed)):.2e}")
    if args.validity:
        validity(args)
        return 0
    results = {}
    for k in (int(x) for x in args.supports.split(",")):
        for eps in (float(x) for x in args.epsilons.split(",")):
            for alt in args.alternatives.split(","):
                results[(k, eps, alt)] = scenario(k, eps, alt, args)
    summary(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
