"""Power and throughput of the distribution-preservation suite (prints figures, asserts nothing).

Four measurements:

0. **Design check** (``--design``): achieved power at each direct case's TV distance and the run's
   false-alarm rate, against the design (power 1 - beta = 0.999 per designed check; family-wise
   alpha = 1e-4 per run). Simulated at the level of the counts, with the runner's own pieces: the
   threshold m / alpha of a default ``specwatch check --target reference`` run (m = every check of
   ``CASES``), each case's cap (``specwatch.runner.trial_cap``), its batch schedule (the first batch,
   doubling to 65,536) and the Dirichlet-mixture e-process after every batch. Per batch a check gets
   Binomial(batch, reach) observations, multinomial from its law. Power: for every designed check of
   every direct case, the least-favourable alternative at the case's epsilon (the law at TV epsilon with
   the smallest chi^2 divergence: p0 scaled up by epsilon / p0(S) on a set S of about half the mass and
   down by epsilon / p0(not S) on the rest; a one-cell law can only move mass off its support: certain),
   ``--power-runs`` runs each; a case's power is its weakest designed check's. False alarms:
   ``--null-runs`` runs of the whole battery with every check (designed and joint) drawn from its null,
   checks independent of each other (the real ones of a case share trials; Bonferroni needs no
   independence), each run to its caps; an alarm is any check reaching the threshold. Also at a larger
   alpha (``--null-alpha``), where alarms are frequent enough to compare with alpha.

0d. **Miss rate** (``--miss-rate``): one designed check of reach 1 (Zipf null on 2, 16 and 256 cells), alone or
   beside a clean 8-cell check of reach 0.1 or 0.3 (``--miss-beside``) that sets the case's cap, at the caps and
   planned observations the design gives at ``--miss-epsilon`` (default 0.05) and the threshold of a
   ``--early-tests``-check run, the runner's early-pass batches, ``--miss-runs`` runs (default 2000) of the
   least-favourable alternative at 0.7, 0.9, 1 and 1.5 x epsilon: misses under four stop rules read off the same runs
   (to the cap; every check has its planned observations; planned observations or the pass statistic, the runner's
   since suite 0.5; the pass statistic only, the runner's until 0.4; each with the hold), with two-sided 95 %
   Clopper-Pearson intervals, and the trials by which the e-process rejected all but a fraction beta of the runs
   (docs/statistics.md §7, §7a); then
   ``--miss-clean-runs`` clean runs per case: where each rule stops it.

0e. **Clean checks that hold** (``--hold-null``): how often a check's null e-process reaches the early pass's hold
   level, ln T / 4 (``early_pass.HOLD_FRACTION``), within 32 looks (2,000 runs on 2, 8 and 64 cells).

1. **Mutant detection.** Every mutant of ``specwatch.mutants.MUTANTS`` runs the whole battery
   ``specwatch.cases.CASES`` (the edge checks last) through ``run_suite`` with the default ``SuiteConfig(seed=s,
   fail_fast=True)`` for several seeds. Per mutant: the detecting case (the first failing one; the
   most frequent over seeds), the failed layer(s), the median ``n_trials`` of the failing case, the
   median trials at which its decisive check rejected, and the median trials spent in the cases run
   before it. For comparison, the fixed-n Pearson chi^2 design at the same per-test level
   (alpha_test = 1 / threshold = alpha / m) and power 1 - beta, computed from the mutant's *actual*
   law on that check: a Monte Carlo run of ``ChainExperiment(step, mutant.sampler)`` estimates the
   mutant's cell law P, its chi^2 divergence D = sum (P - p0)^2 / p0 over p0 > 0 (unbiased estimator
   N_i (N_i - 1) / (N (N - 1)) for P_i^2) and the design n solves P(chi'^2_k(n D) > chi^2_{k,1-alpha})
   = 1 - beta with k = support - 1 (``specwatch.stats.pearson_noncentrality``), converted to
   trials by dividing by the rate at which the mutant's trials reach the check. Mass on a p0 = 0 cell
   is a certain (support) refutation: no Pearson n, the expected trials to the first such
   observation are shown instead. "best fixed-n" is the smallest such design over all checks of the
   case (the sequential test monitors them all). The sequential test looks at batch ends only (1024,
   2048, ... trials), so 1024 trials is its floor.
2. **Harness throughput.** For the reference sampler on representative cases: trials/s of a bare loop
   calling the sampler with the harness's batch sizes (1024 doubling to 65536), of the same loop
   through ``ChainExperiment.run`` (sampling + counting and checks), and of ``run_case`` (everything:
   counting, e-process of every check after every batch, final result with its Monte-Carlo p-value
   cross-check), all for the same total number of trials (the case's cap).
3. **Reference battery wall time** for one seed with the default configuration.

Run (defaults fit in about 2 minutes on two cores)::

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/suite_power.py --design   # 200 runs per check, 2000 null runs

    OMP_NUM_THREADS=1 .venv/bin/python bench/suite_power.py --miss-rate --miss-runs 5000   # about 10 minutes
    OMP_NUM_THREADS=1 .venv/bin/python bench/suite_power.py
    OMP_NUM_THREADS=1 .venv/bin/python bench/suite_power.py --seeds 10 --mc-trials 4000000
    OMP_NUM_THREADS=1 .venv/bin/python bench/suite_power.py --quick          # 2 seeds, smaller Monte Carlo
    OMP_NUM_THREADS=1 .venv/bin/python bench/suite_power.py --mutants 'relaxed*' --skip-throughput
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import math
import platform
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.cases import CASES, Case
from specwatch.early_pass import hold_level, log_pass_statistic
from specwatch.experiments import ChainExperiment, CheckSpec
from specwatch.mutants import MUTANTS, Mutant
from specwatch.protocol import CaseResult, Verdict
from specwatch.runner import EARLY_PASS_LOOKS, SHORTFALL_PROBABILITY, Progress, SuiteConfig, designed_checks, run_case, run_suite, trial_cap
from specwatch.sampling import Sampler, reference_sampler
from specwatch.stats import log_e_dirichlet_mixture, pearson_noncentrality, plan_test, rejection_threshold, trials_for_observations

THROUGHPUT_CASES = ("direct/far_apart/V64/g3", "direct/llm_like/V1024/g4", "direct/large_vocab/V50257/g1")
MC_BATCH = 1 << 16
MC_CHUNKS = 8  # independent chunks of the Monte Carlo, for a standard error of D

_REJECTED = re.compile(r"^(?:lossless|conformance): (\S+) e-value reached the threshold \S+ after (\d+) trials")
_CERTAIN = re.compile(r"^certain \w+ violation: ([a-z]+/\w+): ")


# --------------------------------------------------------------------------------------------- output


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> None:
    """Plain aligned text: ``align`` holds one of 'l' / 'r' per column."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align, strict=True)).rstrip()

    print(f"\n{title}")
    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))


def fmt_n(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "-"
    if math.isinf(x):
        return "never"
    if x < 1e4:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def fmt_ratio(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.3g}"


def short_case(case_id: str) -> str:
    return case_id.removeprefix("direct/")


# ------------------------------------------------------------------------------ mutant detection


@dataclass(frozen=True)
class SeedOutcome:
    """What one seed of the battery did against one mutant."""

    case_id: str | None  # the first failing case; None if the battery passed
    layers: str
    n_trials: int
    alarm_trials: int
    trials_before: int
    check: str | None
    threshold: float
    errors: int


@dataclass(frozen=True)
class CheckLaw:
    """The mutant's estimated law on one check, against the check's null."""

    name: str
    support: int
    rate: float  # observations per trial under the mutant
    bad_mass: float  # P(cell with p0 = 0 | observation)
    divergence: float  # chi^2 divergence D (unbiased estimate)
    divergence_se: float
    structural: bool = False  # the mutant's output is malformed: refuted with certainty

    @property
    def certain(self) -> bool:
        return self.structural or self.bad_mass > 0

    def fixed_n_trials(self, alpha_test: float, beta: float) -> float:
        """Fixed-n Pearson design in trials (whole observations); inf if D is not positive. Not for a certain check."""
        if self.rate <= 0 or self.divergence <= 0:
            return math.inf
        return math.ceil(noncentrality(self.support, alpha_test, beta) / self.divergence) / self.rate

    def trials_to_hit(self) -> float:
        """Expected trials until the first observation in a p0 = 0 cell."""
        return 1.0 if self.structural else 1.0 / (self.rate * self.bad_mass)

    def power_key(self, alpha_test: float, beta: float) -> tuple[int, float]:
        """Orders checks by how soon a fixed-n design refutes the mutant: certain ones first."""
        return (0, self.trials_to_hit()) if self.certain else (1, self.fixed_n_trials(alpha_test, beta))

    def describe_fixed(self, alpha_test: float, beta: float) -> str:
        if self.structural:
            return "certain (malformed)"
        if self.bad_mass > 0:
            return f"certain (support), ~{fmt_n(self.trials_to_hit())} trials/hit"
        return fmt_n(self.fixed_n_trials(alpha_test, beta))


@cache
def noncentrality(support: int, alpha: float, beta: float) -> float:
    return pearson_noncentrality(support, alpha, beta)


def decisive_check(result: CaseResult) -> tuple[str | None, int | None]:
    """The check that decided the failing case and the trials at its rejection, as the runner reports them.

    The reason names the first check to reject in the failed layer (lossless first); for a certain
    violation it names the check; for a malformed output there is none: fall back to the headline
    (strongest evidence in the failed layer).
    """
    if match := _REJECTED.match(result.reason):
        return match.group(1), int(match.group(2))
    if match := _CERTAIN.match(result.reason):
        return match.group(1), None
    layer = "lossless" if result.lossless == Verdict.FAIL else "conformance"
    pool = [c for c in result.checks if c.layer == layer]
    if not pool:
        return None, None
    best = max(pool, key=lambda c: math.inf if c.log_e_value is None else c.log_e_value)
    return best.name, None


def run_seed(mutant: Mutant, seed: int) -> SeedOutcome:
    first_alarm: dict[str, int] = {}

    def progress(p: Progress) -> None:
        if p.log_e >= p.log_threshold:
            first_alarm.setdefault(p.case_id, p.trials)

    run = run_suite(CASES, mutant.sampler, SuiteConfig(seed=seed, fail_fast=True), target=f"mutant:{mutant.name}", progress=progress)
    errors = sum(r.verdict == Verdict.ERROR for r in run.results)
    index = next((i for i, r in enumerate(run.results) if r.verdict == Verdict.FAIL), None)
    if index is None:
        trials = sum(r.n_trials for r in run.results)
        return SeedOutcome(None, "-", 0, 0, trials, None, run.results[0].threshold, errors)
    failing = run.results[index]
    check, rejected_at = decisive_check(failing)
    alarm = rejected_at if rejected_at is not None else first_alarm.get(failing.case_id, failing.n_trials)
    layers = "+".join(
        name for name, verdict in (("lossless", failing.lossless), ("conformance", failing.conformance)) if verdict == Verdict.FAIL
    )
    before = sum(r.n_trials for r in run.results[:index])
    return SeedOutcome(failing.case_id, layers, failing.n_trials, alarm, before, check, failing.threshold, errors)


def unbiased_divergence(counts: NDArray[np.int64], p0: NDArray[np.float64]) -> float:
    """Unbiased estimate of sum_{p0 > 0} (P - p0)^2 / p0 from multinomial counts of P (N >= 2)."""
    n = float(counts.sum())
    keep = p0 > 0
    c, p = counts[keep].astype(np.float64), p0[keep]
    p_squared = c * (c - 1.0) / (n * (n - 1.0))
    return float((p_squared / p - 2.0 * c / n + p).sum())


def mutant_laws(case: Case, sampler: Sampler, trials: int, seed: int) -> dict[str, CheckLaw]:
    """Monte Carlo estimate of the mutant's law on every check of ``case``."""
    experiment = ChainExperiment(case.step(), sampler)
    generator = torch.Generator().manual_seed(seed)
    chunk_trials = max(trials // MC_CHUNKS, 2)
    chunks: list[dict[str, NDArray[np.int64]]] = []
    structural = False
    for _ in range(MC_CHUNKS):
        counts = {c.name: np.zeros(len(c.null), dtype=np.int64) for c in experiment.checks}
        done = 0
        while done < chunk_trials:
            n = min(MC_BATCH, chunk_trials - done)
            obs = experiment.run(n, generator)
            done += n
            if not obs.counts:  # malformed output: the experiment refuses to count it
                structural = True
                continue
            for name, value in obs.counts.items():
                counts[name] += value
        chunks.append(counts)
    total_trials = chunk_trials * MC_CHUNKS
    return {c.name: _check_law(c, [chunk[c.name] for chunk in chunks], total_trials, structural) for c in experiment.checks}


def _check_law(check: CheckSpec, chunks: Sequence[NDArray[np.int64]], trials: int, structural: bool) -> CheckLaw:
    total = np.sum(chunks, axis=0)
    n = int(total.sum())
    if n < 2:
        return CheckLaw(check.name, check.support, n / trials, 0.0, 0.0, math.inf, structural)
    bad = float(total[check.null <= 0].sum()) / n
    per_chunk = [unbiased_divergence(c, check.null) for c in chunks if c.sum() >= 2]
    se = statistics.stdev(per_chunk) / math.sqrt(len(per_chunk)) if len(per_chunk) > 1 else math.inf
    return CheckLaw(check.name, check.support, n / trials, bad, unbiased_divergence(total, check.null), se, structural)


def median_int(values: Sequence[int]) -> float:
    return float(statistics.median(values)) if values else math.nan


def mutant_section(mutants: Sequence[Mutant], seeds: int, mc_trials: int, beta: float) -> None:
    cases = {c.id: c for c in CASES}
    rows: list[list[str]] = []
    law_rows: list[list[str]] = []
    thresholds: set[float] = set()
    notes: list[str] = []
    for mutant in mutants:
        started = time.perf_counter()
        outcomes = [run_seed(mutant, s) for s in range(seeds)]
        detected = [o for o in outcomes if o.case_id is not None]
        missed = seeds - len(detected)
        label = mutant.name + (" [lossless by design]" if mutant.lossless else "")
        if not detected:
            rows.append([label, "NOT DETECTED", "-", f"0/{seeds}", "-", "-", "-", "-", "-", "-", "-"])
            continue
        case_id, hits = Counter(o.case_id for o in detected).most_common(1)[0]
        assert case_id is not None
        same = [o for o in detected if o.case_id == case_id]
        check = Counter(o.check for o in same).most_common(1)[0][0]
        layer_counts = Counter(o.layers for o in same).most_common()
        layers = layer_counts[0][0] if len(layer_counts) == 1 else ", ".join(f"{name} {k}/{len(same)}" for name, k in layer_counts)
        alpha_test = 1.0 / same[0].threshold
        thresholds.update(o.threshold for o in same)
        seq_alarm = median_int([o.alarm_trials for o in same])
        if missed:
            notes.append(f"{mutant.name}: battery PASSED on {missed}/{seeds} seeds (missed)")
        if len(same) < len(detected):
            others = Counter(short_case(o.case_id) for o in detected if o.case_id != case_id and o.case_id is not None)
            notes.append(f"{mutant.name}: other detecting cases on some seeds: {dict(others)}")
        if mutant.lossless and any("lossless" in o.layers for o in detected):
            notes.append(f"{mutant.name}: lossless by design but the LOSSLESS layer failed (a false alarm?)")
        if errors := sum(o.errors for o in outcomes):
            notes.append(f"{mutant.name}: {errors} case(s) errored")
        if cases[case_id].extreme is not None:  # a deterministic edge check: no sample size applies
            edge = f"none: edge check ({cases[case_id].extreme.value})"
            rows.append(
                [
                    label,
                    short_case(case_id),
                    layers,
                    f"{hits}/{seeds}",
                    fmt_n(median_int([o.n_trials for o in same])),
                    "-",
                    fmt_n(median_int([o.trials_before for o in same])),
                    "certain violation",
                    edge,
                    "-",
                    "-",
                ]
            )
            continue
        laws = mutant_laws(cases[case_id], mutant.sampler, mc_trials, seed=_stable_seed(mutant.name, case_id))
        law = laws.get(check) if check is not None else None
        best_name, best_law = min(laws.items(), key=lambda kv: kv[1].power_key(alpha_test, beta))
        ratio = None
        if law is not None and not law.certain:
            fixed = law.fixed_n_trials(alpha_test, beta)
            ratio = seq_alarm / fixed if math.isfinite(fixed) else None
        rows.append(
            [
                label,
                short_case(case_id),
                layers,
                f"{hits}/{seeds}",
                fmt_n(median_int([o.n_trials for o in same])),
                fmt_n(seq_alarm),
                fmt_n(median_int([o.trials_before for o in same])),
                check or "-",
                law.describe_fixed(alpha_test, beta) if law is not None else "-",
                fmt_ratio(ratio),
                f"{best_law.describe_fixed(alpha_test, beta)} ({best_name})",
            ]
        )
        if law is not None:
            rel = law.divergence_se / law.divergence if law.divergence > 0 else math.inf
            law_rows.append(
                [
                    mutant.name,
                    law.name,
                    str(law.support),
                    f"{law.rate:.4f}",
                    f"{law.bad_mass:.3g}",
                    f"{law.divergence:.4g}",
                    f"{100 * rel:.1f}%" if math.isfinite(rel) else "-",
                    f"{noncentrality(law.support, alpha_test, beta):.1f}",
                    f"{time.perf_counter() - started:.1f}",
                ]
            )
    print_table(
        f"1. Mutant detection: run_suite(CASES, mutant, SuiteConfig(seed=s, fail_fast=True)), seeds 0..{seeds - 1}; "
        f"fixed-n Pearson at alpha_test = 1/threshold (threshold m/alpha = {', '.join(f'{t:.4g}' for t in sorted(thresholds))}), "
        f"power 1-{beta:g}, D from {mc_trials:.2g} Monte Carlo trials",
        [
            "mutant",
            "detecting case",
            "layer failed",
            "seeds",
            "med n_trials",
            "med alarm",
            "med before",
            "decisive check",
            "fixed-n Pearson (trials)",
            "alarm/fixed",
            "best fixed-n (check)",
        ],
        rows,
        "llllrrrlrrl",
    )
    print(
        "   med n_trials: n_trials of the failing CaseResult (a conformance-only failure keeps testing losslessness up to the cap);\n"
        "   med alarm: trials at which the decisive check crossed the threshold (batch ends; floor 1024);\n"
        "   med before: trials spent in the cases run before the detecting one (all passed)."
    )
    print_table(
        "   Mutant law on the decisive check (Monte Carlo): rate = observations per trial, bad = mass on p0 = 0 cells,"
        " D = chi^2 divergence (± standard error), lambda = Pearson noncentrality needed",
        ["mutant", "check", "support", "rate", "bad", "D", "D s.e.", "lambda", "wall s"],
        law_rows,
        "llrrrrrrr",
    )
    for note in notes:
        print(f"   NOTE {note}")


def _stable_seed(*parts: str) -> int:
    return int.from_bytes(hashlib.blake2b(":".join(parts).encode(), digest_size=8).digest(), "big") & ((1 << 63) - 1)


# ------------------------------------------------------------------------------------ throughput


def batch_sizes(total: int, first: int, largest: int) -> list[int]:
    sizes, done, batch = [], 0, first
    while done < total:
        n = min(batch, total - done)
        sizes.append(n)
        done += n
        batch = min(2 * batch, largest)
    return sizes


def time_bare(case: Case, sizes: Sequence[int], seed: int) -> float:
    step = case.step()
    generator = torch.Generator().manual_seed(seed)
    reference_sampler(step, sizes[0], generator)  # warm-up (processed probabilities are cached)
    started = time.perf_counter()
    for n in sizes:
        reference_sampler(step, n, generator)
    return time.perf_counter() - started


def time_counting(case: Case, sizes: Sequence[int], seed: int) -> float:
    experiment = case.build(reference_sampler, torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    experiment.run(sizes[0], generator)
    started = time.perf_counter()
    for n in sizes:
        experiment.run(n, generator)
    return time.perf_counter() - started


def time_harness(case: Case, config: SuiteConfig, tests: int) -> tuple[float, CaseResult]:
    experiment = case.build(reference_sampler, torch.device(config.device))
    started = time.perf_counter()
    result = run_case(case, experiment, config, tests)
    return time.perf_counter() - started, result


def throughput_section(case_ids: Sequence[str], repeats: int) -> None:
    cases = {c.id: c for c in CASES}
    config = SuiteConfig(seed=0)
    tests = sum(len(c.build(reference_sampler, torch.device("cpu")).checks) for c in CASES)
    rows: list[list[str]] = []
    for case_id in case_ids:
        case = cases[case_id]
        harness, result = min((time_harness(case, config, tests) for _ in range(repeats)), key=lambda tr: tr[0])
        sizes = batch_sizes(result.n_trials, config.first_batch, config.max_batch)
        bare = min(time_bare(case, sizes, 1) for _ in range(repeats))
        counting = min(time_counting(case, sizes, 1) for _ in range(repeats))
        n, loop = result.n_trials, result.duration_s  # duration_s: the batch loop, before the final result
        rows.append(
            [
                short_case(case_id),
                f"{n:,}",
                str(len(sizes)),
                f"{n / bare:,.0f}",
                f"{n / counting:,.0f}",
                f"{n / harness:,.0f}",
                f"{bare:.3f}",
                f"{counting:.3f}",
                f"{loop:.3f}",
                f"{harness - loop:.3f}",
                f"{harness:.3f}",
                f"{loop / bare:.2f}",
                f"{harness / bare:.2f}",
            ]
        )
    print_table(
        f"2. Harness throughput, reference sampler, CPU, best of {repeats}: the same trials in the same batches (1024 doubling to 65536)",
        [
            "case",
            "trials",
            "batches",
            "bare/s",
            "+counting/s",
            "run_case/s",
            "bare s",
            "counting s",
            "loop s",
            "final s",
            "run_case s",
            "loop/bare",
            "harness/bare",
        ],
        rows,
        "lrrrrrrrrrrrr",
    )
    print(
        "   bare: the sampler alone; +counting: ChainExperiment.run (sampler, structural checks, bincounts); run_case: the full harness.\n"
        "   loop s: run_case's own duration_s (batches, counting, e-process of every check after every batch);\n"
        "   final s: the rest of run_case (the result: TV intervals, Monte-Carlo p-value cross-check of the decisive check);\n"
        "   harness/bare = run_case s / bare s."
    )


# ------------------------------------------------------------------------------- reference battery


def battery_section() -> None:
    for early_pass in (True, False):
        started = time.perf_counter()
        run = run_suite(CASES, reference_sampler, SuiteConfig(seed=0, early_pass=early_pass))
        wall = time.perf_counter() - started
        trials = sum(r.n_trials for r in run.results)
        failed = [r.case_id for r in run.results if r.verdict != Verdict.PASS]
        early = sum(r.early_pass for r in run.results)
        print(
            f"\n3. Reference battery, seed 0, SuiteConfig(early_pass={early_pass}): {len(run.results)} cases ({early} stopped on an "
            f"early pass), {run.tests} tests, verdict {run.verdict}, {trials:,} trials, wall {wall:.2f} s "
            f"(run_suite duration_s {run.duration_s:.2f} s, {trials / wall:,.0f} trials/s)"
        )
        if failed:
            print(f"   NOTE non-passing cases: {failed}")
        slowest = sorted(run.results, key=lambda r: r.duration_s, reverse=True)[:3]
        print("   slowest: " + ", ".join(f"{short_case(r.case_id)} {r.duration_s:.2f} s ({r.n_trials:,} trials)" for r in slowest))


# ------------------------------------------------------------------------------------- design check


def least_favourable(p0: NDArray[np.float64], epsilon: float) -> tuple[NDArray[np.float64], bool]:
    """The law at TV ``epsilon`` from ``p0`` with (about) the smallest chi^2 divergence, 4 epsilon^2, and
    whether it needs mass off the support (a one-cell law: then any deviation is a certain refutation)."""
    support = np.flatnonzero(p0 > 0)
    if len(support) == 1 or len(support) == len(p0) == 1:
        outside = np.flatnonzero(p0 <= 0)
        alt = p0.copy()
        alt[support[0]] -= epsilon
        alt[outside[0] if len(outside) else support[0]] += epsilon
        return alt, True
    up = np.zeros(len(p0), dtype=bool)
    mass_up = mass_down = 0.0
    for cell in support[np.argsort(-p0[support], kind="stable")]:  # greedy halves: each cell to the lighter side
        if mass_up <= mass_down:
            up[cell], mass_up = True, mass_up + p0[cell]
        else:
            mass_down += p0[cell]
    down = (~up) & (p0 > 0)
    if mass_down < mass_up:  # the heavier side goes down (it must give up epsilon); chi^2 is the same either way
        up, down, mass_up, mass_down = down, up, mass_down, mass_up
    shift = min(epsilon, mass_down)
    alt = p0.copy()
    alt[up] *= 1.0 + shift / mass_up
    alt[down] *= 1.0 - shift / mass_down
    return alt / alt.sum(), False


def batch_schedule(cap: int, config: SuiteConfig, *, early_pass: bool = False) -> list[int]:
    """The runner's batches: max(16, min(first_batch, cap // 8)), doubling to max_batch (with the early pass: from
    max(16, min(first_batch, cap // EARLY_PASS_LOOKS)) to cap // EARLY_PASS_LOOKS), up to the cap."""
    first = max(16, min(config.first_batch, cap // (EARLY_PASS_LOOKS if early_pass else 8)))
    return batch_sizes(cap, first, min(config.max_batch, max(first, cap // EARLY_PASS_LOOKS)) if early_pass else config.max_batch)


def simulate_check(
    law: NDArray[np.float64],
    null: NDArray[np.float64],
    reach: float,
    batches: Sequence[int],
    log_threshold: float,
    rng: np.random.Generator,
) -> tuple[bool, int]:
    """One run of a check's e-process on counts drawn from ``law``: (rejected by the cap, trials at the stop)."""
    counts = np.zeros(len(null), dtype=np.int64)
    zero = null <= 0
    trials = 0
    for n in batches:
        trials += n
        observed = int(rng.binomial(n, reach)) if reach < 1 else n
        if observed:
            counts += rng.multinomial(observed, law)
        if counts[zero].any() or log_e_dirichlet_mixture(counts, null) >= log_threshold:
            return True, trials
    return False, trials


@dataclass(frozen=True)
class CaseDesign:
    case: Case
    epsilon: float
    cap: int
    batches: list[int]
    checks: list[CheckSpec]
    designed: list[CheckSpec]


def battery_designs(config: SuiteConfig) -> tuple[int, list[CaseDesign]]:
    """Every direct case's design in a default run of the whole battery, and the run's number of checks."""
    built = [(case, case.build(reference_sampler, torch.device("cpu"))) for case in CASES]
    tests = sum(len(e.checks) for _, e in built)
    threshold = rejection_threshold(config.alpha, tests)
    designs = []
    for case, experiment in built:
        if case.family != "direct":
            continue
        epsilon = config.epsilon_for(case)
        cap = trial_cap(experiment, config, epsilon, threshold)
        designed = designed_checks(experiment, epsilon)
        designs.append(CaseDesign(case, epsilon, cap, batch_schedule(cap, config), list(experiment.checks), designed))
    return tests, designs


def wilson_upper(k: int, n: int, z: float = 1.959964) -> float:
    """Upper end of the 95 % Wilson interval of a proportion (k of n)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return min(1.0, centre + half)


def exact_upper(k: int, n: int, confidence: float = 0.95) -> float:
    """Clopper-Pearson upper bound of a proportion (k of n), one-sided."""
    from scipy import stats as sps

    return 1.0 if k >= n else float(sps.beta.ppf(confidence, k + 1, n - k))


def design_section(power_runs: int, null_runs: int, null_alpha: float, seed: int, cases: Sequence[str]) -> None:
    config = SuiteConfig()
    tests, designs = battery_designs(config)
    if cases:
        designs = [d for d in designs if any(fnmatch.fnmatchcase(d.case.id, g) for g in cases)]
    threshold = rejection_threshold(config.alpha, tests)
    log_threshold = math.log(threshold)
    rng = np.random.default_rng(seed)
    rows: list[list[str]] = []
    total_misses = total_runs = 0
    started = time.perf_counter()
    ordered = sorted(designs, key=lambda d: d.case.step().vocab_size >= 10_000)  # the slow large vocabulary last
    for design in ordered if power_runs > 0 else []:
        worst: tuple[float, str, int, int, float] | None = None
        for check in design.designed:
            alt, certain = least_favourable(check.null, design.epsilon)
            hits, stops = 0, []
            for _ in range(power_runs):
                rejected, at = simulate_check(alt, check.null, check.reach, design.batches, log_threshold, rng)
                hits += rejected
                stops.append(at)
            power = hits / power_runs
            total_misses += power_runs - hits
            total_runs += power_runs
            entry = (power, check.name + (" (certain)" if certain else ""), hits, int(statistics.median(stops)), check.reach)
            if worst is None or entry[0] < worst[0]:
                worst = entry
        if worst is None:
            continue
        power, name, hits, median_stop, reach = worst
        rows.append(
            [
                short_case(design.case.id),
                f"{design.epsilon:g}",
                f"{design.cap:,}",
                str(len(design.designed)),
                name,
                f"{reach:.3g}",
                f"{hits}/{power_runs}",
                f"{power:.3f}",
                f"{exact_upper(power_runs - hits, power_runs):.3g}",
                f"{median_stop / design.cap:.2f}",
            ]
        )
        print(f"   ... {' | '.join(rows[-1])} ({time.perf_counter() - started:.0f} s)", flush=True)
    if power_runs > 0:
        print_table(
            f"0a. Achieved power at each direct case's epsilon (least-favourable alternative per designed check, {power_runs} runs each; "
            f"threshold m/alpha = {threshold:.4g}, m = {tests}); the weakest designed check of each case; "
            f"design: power >= {1 - config.beta:g}",
            ["case", "eps", "cap", "designed", "weakest check", "reach", "detected", "power", "miss 95% up", "med stop/cap"],
            rows,
            "lrrrlrrrrr",
        )
        print(
            f"   all designed checks together: {total_misses} misses in {total_runs} runs "
            f"(miss rate {total_misses / max(total_runs, 1):.2g}, one-sided 95 % upper bound {exact_upper(total_misses, total_runs):.2g}; "
            f"design beta = {config.beta:g})",
            flush=True,
        )
    if null_runs > 0:
        null_section(designs, tests, null_runs, sorted({config.alpha, null_alpha}), rng)


def null_max_log_e(null: NDArray[np.float64], reach: float, batches: Sequence[int], rng: np.random.Generator) -> float:
    """One null run of a check to its cap: the largest log E over its batch ends (inf after a support violation)."""
    counts = np.zeros(len(null), dtype=np.int64)
    best = 0.0
    for n in batches:
        observed = int(rng.binomial(n, reach)) if reach < 1 else n
        if observed:
            counts += rng.multinomial(observed, null)
        best = max(best, log_e_dirichlet_mixture(counts, null))
    return best


def null_section(designs: Sequence[CaseDesign], tests: int, runs: int, alphas: Sequence[float], rng: np.random.Generator) -> None:
    """Null runs of the battery; each run's checks are compared with the threshold of every alpha in ``alphas``."""
    log_thresholds = {alpha: math.log(rejection_threshold(alpha, tests)) for alpha in alphas}
    checks = [(c, d.batches) for d in designs for c in d.checks]
    alarms = dict.fromkeys(alphas, 0)
    check_alarms = dict.fromkeys(alphas, 0)
    started = time.perf_counter()
    done = 0

    def report(final: bool) -> None:
        for alpha in alphas:
            line = (
                f"{done} null runs of the direct battery ({len(checks)} checks each, every one to its cap), alpha = {alpha:g} "
                f"(threshold m/alpha, m = {tests}): {alarms[alpha]} runs with an alarm (rate {alarms[alpha] / max(done, 1):.3g}; "
                f"one-sided 95 % upper bound {exact_upper(alarms[alpha], max(done, 1)):.3g}; design <= {alpha:g}); "
                f"{check_alarms[alpha]} check alarms in {done * len(checks):,} null check-runs"
            )
            print(("\n0b. False alarms: " if final else "   ... ") + line, flush=True)
        if not final:
            print(f"       ({time.perf_counter() - started:.0f} s)", flush=True)

    for _ in range(runs):
        maxima = [null_max_log_e(check.null, check.reach, batches, rng) for check, batches in checks]
        for alpha, log_threshold in log_thresholds.items():
            crossed = sum(m >= log_threshold for m in maxima)
            check_alarms[alpha] += crossed
            alarms[alpha] += crossed > 0
        done += 1
        if done % 5 == 0:
            report(final=False)
    report(final=True)


# ------------------------------------------------------------------------------------- early pass


EARLY_PASS_HEADERS = (
    *("support", "eps", "cap", "misses off", "misses on", "alt early", "alarms off/on"),
    *("null early", "med stop off", "med stop on", "mean stop on"),
)


def early_pass_run(
    law: NDArray[np.float64],
    null: NDArray[np.float64],
    batches: Sequence[int],
    epsilon: float,
    levels: tuple[float, float],
    rng: np.random.Generator,
) -> tuple[int | None, int | None, int]:
    """One check run to its cap on counts from ``law``: (trials at the rejection, at the early pass, at the cap);
    ``levels``: ln of the rejection threshold and of 1 / beta_pass."""
    log_threshold, log_pass = levels
    counts = np.zeros(len(null), dtype=np.int64)
    trials, rejected, passed = 0, None, None
    for n in batches:
        trials += n
        counts += rng.multinomial(n, law)
        if rejected is None and log_e_dirichlet_mixture(counts, null) >= log_threshold:
            rejected = trials
        if passed is None and log_pass_statistic(counts, null, epsilon, target=log_pass) >= log_pass:
            passed = trials
        if rejected is not None and passed is not None:
            break
    return rejected, passed, trials


def early_pass_section(supports: Sequence[int], epsilons: Sequence[float], runs: int, tests: int, seed: int) -> None:
    """Per (support, epsilon), one designed check of reach 1 with a Zipf null p0 ~ 1/(i+1), its cap and the runner's
    batches at the threshold m / alpha of a run of ``tests`` checks (default 211, the reference battery), beta = 1e-3,
    beta_pass = 1e-3. Null runs: false alarms (a rejection before the stop) and stopping time with and without the
    early pass. Least-favourable alternative at TV epsilon (``least_favourable``): power with and without, and how
    often the early pass stopped the case before a rejection (the bound: beta_pass)."""
    config = SuiteConfig()
    threshold = rejection_threshold(config.alpha, tests)
    log_threshold, log_pass = math.log(threshold), -math.log(config.early_pass_beta)
    rng = np.random.default_rng(seed)
    rows: list[list[str]] = []
    for epsilon in epsilons:
        for support in supports:
            null = 1.0 / np.arange(1, support + 1)
            null /= null.sum()
            cap = plan_test(support, 1.0, epsilon, 1.0 / threshold, config.beta).needed
            batches = batch_schedule(cap, config, early_pass=True)
            started = time.perf_counter()
            stops_on, stops_off, alarms_on, alarms_off, early = [], [], 0, 0, 0
            for _ in range(runs):
                rejected, passed, _ = early_pass_run(null, null, batches, epsilon, (log_threshold, log_pass), rng)
                stop_off = rejected or cap
                stop_on = min(stop_off, passed or cap)
                alarms_off += rejected is not None
                alarms_on += rejected is not None and rejected <= stop_on
                early += passed is not None
                stops_on.append(stop_on)
                stops_off.append(stop_off)
            alt, _ = least_favourable(null, epsilon)
            misses_on = misses_off = early_alt = 0
            for _ in range(runs):
                rejected, passed, _ = early_pass_run(alt, null, batches, epsilon, (log_threshold, log_pass), rng)
                misses_off += rejected is None
                stopped_early = passed is not None and (rejected is None or passed < rejected)
                misses_on += rejected is None or stopped_early
                early_alt += stopped_early
            rows.append(
                [
                    f"{support}",
                    f"{epsilon:g}",
                    f"{cap:,}",
                    f"{misses_off}/{runs}",
                    f"{misses_on}/{runs}",
                    f"{early_alt}",
                    f"{alarms_off}/{alarms_on}",
                    f"{early / runs:.2f}",
                    f"{statistics.median(stops_off) / cap:.2f}",
                    f"{statistics.median(stops_on) / cap:.2f}",
                    f"{statistics.mean(stops_on) / cap:.2f}",
                ]
            )
            print(f"   ... {' | '.join(rows[-1])} ({time.perf_counter() - started:.0f} s)", flush=True)
    print_table(
        f"0c. Early pass (docs/statistics.md §7a): one designed check, Zipf null, {runs} null and {runs} alternative runs per row; "
        f"threshold m/alpha = {threshold:.4g} (m = {tests}), beta = {config.beta:g}, beta_pass = {config.early_pass_beta:g}; "
        "stop/cap: trials at the stop over the cap (observations, reach 1)",
        EARLY_PASS_HEADERS,
        rows,
        "rrrrrrrrrrr",
    )


# ------------------------------------------------------------------------------------------ miss rate


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The two-sided Clopper-Pearson interval of a proportion (k of n) at ``confidence``."""
    from scipy import stats as sps

    tail = (1.0 - confidence) / 2.0
    low = 0.0 if k == 0 else float(sps.beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k >= n else float(sps.beta.ppf(1.0 - tail, k + 1, n - k))
    return low, high


@dataclass(frozen=True)
class Watched:
    """One designed check of a simulated case: its null, the law its observations follow, its reach (observations per
    trial: Binomial(batch, reach) per batch below 1) and the observations its design plans."""

    null: NDArray[np.float64]
    law: NDArray[np.float64]
    reach: float
    planned: int


@dataclass
class PathEvents:
    """A check's batch ends of one run (trials; None: never): its rejection, its pass statistic's crossing, its planned
    observations reached, its running maximum of ln E reaching the hold level."""

    rejected: int | None = None
    passed: int | None = None
    planned: int | None = None
    held: int | None = None


def case_path(
    checks: Sequence[Watched], batches: Sequence[int], epsilon: float, levels: tuple[float, float, float], rng: np.random.Generator
) -> list[PathEvents]:
    """One run of a case's checks to its cap, or to the first rejection of any check (every rule that has not stopped by
    then catches the bug there); ``levels``: ln of the rejection threshold, of 1 / beta_pass and the hold level
    (ln T / 4, docs/statistics.md §7a). The pass statistic is followed until it crosses, so that every rule is read off
    the same run."""
    log_threshold, log_pass, log_hold = levels
    counts = [np.zeros(len(c.null), dtype=np.int64) for c in checks]
    events = [PathEvents() for _ in checks]
    trials = 0
    for n in batches:
        trials += n
        for check, seen, event in zip(checks, counts, events, strict=True):
            observed = n if check.reach >= 1 else int(rng.binomial(n, check.reach))
            np.add(seen, rng.multinomial(observed, check.law), out=seen)
            log_e = log_e_dirichlet_mixture(seen, check.null)
            if event.held is None and log_e >= log_hold:
                event.held = trials
            if log_e >= log_threshold:
                event.rejected = trials
            if event.planned is None and seen.sum() >= check.planned:
                event.planned = trials
            if event.passed is None and log_pass_statistic(seen, check.null, epsilon, target=log_pass) >= log_pass:
                event.passed = trials
        if any(e.rejected is not None for e in events):
            break
    return events


def rule_stop(events: Sequence[PathEvents], done: Callable[[PathEvents], int | None], cap: int) -> int:
    """Where a case stops under a rule: the first batch end at which every check is ``done``, unless a check's
    evidence reached the hold level by then (the hold is sticky: then the cap)."""
    times = [done(e) for e in events]
    if any(t is None for t in times):
        return cap
    stop = max(t for t in times if t is not None)
    held = min((e.held for e in events if e.held is not None), default=None)
    return cap if held is not None and held <= stop else min(stop, cap)


#: The stop rules of the miss-rate table: (a) to the cap; (b) every check has its planned observations; (c) the suite's
#: rule since 0.5, (b) or the pass statistic, per check; (d) the suite's rule until 0.4, the pass statistic only.
MISS_RULES: dict[str, Callable[[PathEvents], int | None]] = {
    "cap": lambda e: None,
    "planned": lambda e: e.planned,
    "planned or pass": lambda e: min((t for t in (e.planned, e.passed) if t is not None), default=None),
    "pass (0.4)": lambda e: e.passed,
}


MISS_HEADERS = (
    "support",
    "beside",
    "TV/eps",
    "cap",
    *(f"misses: {rule} [95% CP]" for rule in MISS_RULES),
    "(1-beta) rejection/cap",
)
CLEAN_HEADERS = ("support", "beside", "cap", "runs", *(f"mean stop/cap: {rule}" for rule in MISS_RULES), "alarms")


def zipf(support: int) -> NDArray[np.float64]:
    null = 1.0 / np.arange(1, support + 1)
    result: NDArray[np.float64] = null / null.sum()
    return result


#: The reaches of the clean 8-cell check beside which the miss-rate rows also measure a common check: a position reached
#: by a tenth of the trials (like the later draft positions of the reference battery's chain steps: it sets the cap and
#: is done after the common check), and by three tenths (done by its pass statistic before the common check has its
#: planned observations, so that the common check's own planned observations end the case).
PARTNER_REACHES = (0.1, 0.3)


@dataclass(frozen=True)
class MissDesign:
    """The simulated case of a miss-rate row: its measured check's null and planned observations, the partner (None:
    alone), the case's cap and the runner's batches; ``levels`` as :func:`case_path` takes them."""

    null: NDArray[np.float64]
    planned: int
    partner: Watched | None
    cap: int
    batches: list[int]
    epsilon: float
    levels: tuple[float, float, float]

    def checks(self, law: NDArray[np.float64]) -> list[Watched]:
        return [Watched(self.null, law, 1.0, self.planned), *([self.partner] if self.partner else [])]


def miss_row(design: MissDesign, multiple: float, runs: int, beta: float, rng: np.random.Generator) -> list[str]:
    """Misses per rule at TV ``multiple`` x epsilon, and the trials by which the e-process alone rejected all but a
    fraction beta of the runs (on the batch grid; "> 1": more than beta were not rejected by the cap)."""
    alt, _ = least_favourable(design.null, multiple * design.epsilon)
    misses = dict.fromkeys(MISS_RULES, 0)
    rejections = []
    for _ in range(runs):
        events = case_path(design.checks(alt), design.batches, design.epsilon, design.levels, rng)
        caught = min((e.rejected for e in events if e.rejected is not None), default=None)
        rejections.append(math.inf if caught is None else caught)
        for rule, done in MISS_RULES.items():
            misses[rule] += caught is None or caught > rule_stop(events, done, design.cap)
    needed = float(np.quantile(np.array(rejections), 1.0 - beta, method="higher"))
    cells = []
    for k in misses.values():
        low, high = clopper_pearson(k, runs)
        cells.append(f"{k}/{runs} [{low:.2g}, {high:.2g}]")
    return [f"{multiple:g}", f"{design.cap:,}", *cells, "> 1" if math.isinf(needed) else f"{needed / design.cap:.2f}"]


def clean_row(design: MissDesign, runs: int, rng: np.random.Generator) -> list[str]:
    """Where a clean case (every check at its null) stops under each rule, as a fraction of its cap, and its alarms."""
    stops: dict[str, list[int]] = {rule: [] for rule in MISS_RULES}
    alarms = 0
    for _ in range(runs):
        events = case_path(design.checks(design.null), design.batches, design.epsilon, design.levels, rng)
        caught = min((e.rejected for e in events if e.rejected is not None), default=None)
        alarms += caught is not None
        for rule, done in MISS_RULES.items():
            stop = rule_stop(events, done, design.cap)
            stops[rule].append(stop if caught is None else min(stop, caught))
    return [f"{design.cap:,}", f"{runs}", *(f"{statistics.mean(stops[r]) / design.cap:.2f}" for r in MISS_RULES), f"{alarms}"]


def miss_rate_section(
    supports: Sequence[int],
    multiples: Sequence[float],
    epsilon: float,
    runs: int,
    tests: int,
    seed: int,
    clean_runs: int,
    beside: Sequence[float] = PARTNER_REACHES,
) -> None:
    """Measured miss rate of one designed check (reach 1, Zipf null p0 ~ 1/i) against the least-favourable alternative
    at TV multiple x epsilon, alone or beside a clean, rarer designed check (8 cells, each reach of ``beside``) that
    sets the case's cap; caps, planned observations and batches as the runner's (``plan_test`` at threshold m / alpha,
    m = ``tests``; the binomial cap, ``trials_for_observations``; the early pass's batches). Four stop rules on the same
    runs (``MISS_RULES``), each with the hold (no stop once a check's ln E reached ln T / 4). A miss: no rejection of
    the measured check before the stop. Intervals: two-sided 95 % Clopper-Pearson; the design's promise at TV >= epsilon:
    beta (+ beta_pass with the pass statistic). Then the same cases clean: where each rule stops them."""
    config = SuiteConfig()
    threshold = rejection_threshold(config.alpha, tests)
    levels = (math.log(threshold), -math.log(config.early_pass_beta), hold_level(math.log(threshold)))
    rng = np.random.default_rng(seed)
    rows: list[list[str]] = []
    clean: list[list[str]] = []
    for reach in (None, *beside):
        partner = None
        if reach is not None:
            partner = Watched(zipf(8), zipf(8), reach, plan_test(8, reach, epsilon, 1.0 / threshold, config.beta).needed)
        for support in supports:
            planned = plan_test(support, 1.0, epsilon, 1.0 / threshold, config.beta).needed
            cap = planned
            if partner is not None:
                cap = max(planned, int(trials_for_observations(partner.planned, partner.reach, SHORTFALL_PROBABILITY)))
            design = MissDesign(zipf(support), planned, partner, cap, batch_schedule(cap, config, early_pass=True), epsilon, levels)
            label = [f"{support}", "alone" if reach is None else f"8 cells, reach {reach:g}"]
            for multiple in multiples:
                started = time.perf_counter()
                rows.append(label + miss_row(design, multiple, runs, config.beta, rng))
                print(f"   ... {' | '.join(rows[-1])} ({time.perf_counter() - started:.0f} s)", flush=True)
            started = time.perf_counter()
            clean.append(label + clean_row(design, clean_runs, rng))
            print(f"   ... clean: {' | '.join(clean[-1])} ({time.perf_counter() - started:.0f} s)", flush=True)
    settings = (
        f"eps = {epsilon:g}; threshold m/alpha = {threshold:.4g} (m = {tests}), beta = {config.beta:g}, "
        f"beta_pass = {config.early_pass_beta:g}, hold at ln E >= {levels[2]:.2f}; rules: cap = to the cap; planned = every "
        "check has its planned observations; planned or pass = the runner's since suite 0.5; pass (0.4) = every check's "
        "pass statistic (the runner's until 0.4)"
    )
    print_table(
        f"0d. Miss rate by stop rule: one designed check (Zipf null, reach 1) at TV/eps x eps, alone or beside a clean "
        f"8-cell check of a smaller reach that sets the cap, {runs} runs per row; {settings}",
        MISS_HEADERS,
        rows,
        "r" * len(MISS_HEADERS),
    )
    print_table(
        f"0d'. The same cases clean (every check at its null): mean stop over the cap by rule; {settings}",
        CLEAN_HEADERS,
        clean,
        "r" * len(CLEAN_HEADERS),
    )


def hold_null_section(supports: Sequence[int], runs: int, tests: int, seed: int) -> None:
    """How often a clean check holds its case (docs/statistics.md §7a): ``runs`` null runs per support of a check with
    a uniform null, 32 looks of 100 observations each, against the hold level ln T / 4 at the threshold of a
    ``tests``-check run (Ville's bound: T^(-1/4)); also at half of ln T."""
    config = SuiteConfig()
    log_threshold = math.log(rejection_threshold(config.alpha, tests))
    rng = np.random.default_rng(seed)
    rows: list[list[str]] = []
    for support in supports:
        null = np.full(support, 1.0 / support)
        maxima = np.array([null_max_log_e(null, 1.0, [100] * 32, rng) for _ in range(runs)])
        held, half = int((maxima >= hold_level(log_threshold)).sum()), int((maxima >= log_threshold / 2).sum())
        rows.append([str(support), f"{held}/{runs}", f"{math.exp(-hold_level(log_threshold)):.2g}", f"{half}/{runs}"])
    print_table(
        f"0e. Clean checks that hold their case: {runs} null runs per support, 32 looks of 100 observations, "
        f"threshold m/alpha = {math.exp(log_threshold):.4g} (m = {tests})",
        ["support", "held (ln E >= ln T / 4)", "bound T^(-1/4)", "at ln T / 2"],
        rows,
        "rrrr",
    )


# ----------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=None, help="seeds per mutant (default 5; 2 with --quick)")
    parser.add_argument("--mc-trials", type=int, default=None, help="Monte Carlo trials per mutant law (default 2e6; 5e5 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="timing repeats, best kept (default 3; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="fewer seeds, smaller Monte Carlo, one timing repeat")
    parser.add_argument("--mutants", action="append", default=[], metavar="GLOB", help="only these mutants (repeatable)")
    parser.add_argument("--skip-mutants", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-battery", action="store_true")
    parser.add_argument("--design", action="store_true", help="only the design check: achieved power at epsilon and false alarms")
    parser.add_argument("--power-runs", type=int, default=200, help="runs per designed check for the achieved power (default 200)")
    parser.add_argument("--null-runs", type=int, default=2000, help="null runs of the battery for the false-alarm rate (default 2000)")
    parser.add_argument("--null-alpha", type=float, default=0.05, help="also measure false alarms at this alpha (default 0.05)")
    parser.add_argument("--design-cases", action="append", default=[], metavar="GLOB", help="design check of these cases only")
    parser.add_argument("--seed", type=int, default=0, help="seed of the design check's simulation")
    parser.add_argument("--early-pass", action="store_true", help="only the early pass: stopping time, power, false alarms")
    parser.add_argument("--early-runs", type=int, default=500, help="null and alternative runs per early-pass row (default 500)")
    parser.add_argument("--early-tests", type=int, default=211, help="m of the early-pass rows' threshold m / alpha (default 211)")
    parser.add_argument("--miss-rate", action="store_true", help="only the miss rate at 0.7-1.5 eps by stop rule")
    parser.add_argument("--hold-null", action="store_true", help="only how often a clean check holds its case")
    parser.add_argument("--miss-runs", type=int, default=2000, help="runs per miss-rate row (default 2000)")
    parser.add_argument("--miss-epsilon", type=float, default=0.05, help="design TV of the miss-rate rows (default 0.05)")
    parser.add_argument("--miss-clean-runs", type=int, default=1000, help="clean runs per miss-rate case (default 1000)")
    parser.add_argument(
        "--miss-beside", type=float, action="append", default=None, help="reach of the rarer clean check (repeatable; default 0.1, 0.3)"
    )
    args = parser.parse_args()
    seeds = args.seeds if args.seeds is not None else (2 if args.quick else 5)
    mc_trials = args.mc_trials if args.mc_trials is not None else (500_000 if args.quick else 2_000_000)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    if seeds < 1 or mc_trials < 2 * MC_CHUNKS or repeats < 1:
        parser.error("--seeds and --repeats must be >= 1, --mc-trials >= 16")

    torch.set_num_threads(1)
    started = time.perf_counter()
    print(
        f"suite_power: torch {torch.__version__}, numpy {np.__version__}, python {platform.python_version()}, "
        f"{platform.machine()}, torch threads {torch.get_num_threads()}; {len(CASES)} cases, {len(MUTANTS)} mutants"
    )
    if args.hold_null:
        hold_null_section((2, 8, 64), 2000, args.early_tests, args.seed)
        print(f"\ntotal wall time {time.perf_counter() - started:.1f} s")
        return
    if args.miss_rate:
        miss_rate_section(
            (2, 16, 256), (0.7, 0.9, 1.0, 1.5), args.miss_epsilon, args.miss_runs, args.early_tests, args.seed, args.miss_clean_runs
        )
        print(f"\ntotal wall time {time.perf_counter() - started:.1f} s")
        return
    if args.early_pass:
        early_pass_section((8, 16, 64, 128, 512), (0.03, 0.1), args.early_runs, args.early_tests, args.seed)
        print(f"\ntotal wall time {time.perf_counter() - started:.1f} s")
        return
    if args.design:
        design_section(args.power_runs, args.null_runs, args.null_alpha, args.seed, args.design_cases)
        print(f"\ntotal wall time {time.perf_counter() - started:.1f} s")
        return
    if not args.skip_mutants:
        chosen = [m for m in MUTANTS.values() if not args.mutants or any(fnmatch.fnmatchcase(m.name, g) for g in args.mutants)]
        mutant_section(chosen, seeds, mc_trials, SuiteConfig().beta)
    if not args.skip_throughput:
        throughput_section(THROUGHPUT_CASES, repeats)
    if not args.skip_battery:
        battery_section()
    print(f"\ntotal wall time {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
