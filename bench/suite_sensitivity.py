"""Sensitivity per CPU-second of every end-to-end path of the transformers target (and a few direct cases).

Per path (a case of the installed transformers), in one process with one thread, CPU time of this process
(``time.process_time``: the figure that does not depend on how busy the machine is):

* ``obs/CPU-s``: observations of the case's sizing check (every emitted token of a trial for the long-horizon
  conditional check; one per trial for a direct case) per CPU-second of the whole harness (``Experiment.run``:
  the library's calls, the draft observer, the exact laws and the counts);
* ``TV/CPU-min``: the TV distance a design at the run's level (alpha / ``--tests``, power 1 - beta, the
  sequential cap of ``stats.plan_test``) can detect with the observations one CPU-minute gives, the binding
  check of the case deciding;
* ``ratio``: the harness's CPU time against a bare loop of the same calls (``generate()`` with the case's own
  arguments, prompt and models; the direct sampler on the case's step), same number of trials; goal <= 1.3.
  Below 1 where the harness saves work a user's loop pays (the MTP layers loaded once per process);
* ``CPU-s@e``: projected CPU-seconds of the case at the design TV e (its trial cap, ``runner.trial_cap``, times
  the measured CPU per trial), for each ``--design`` value; the last line sums them (2 idle cores: about half
  of the sum in wall time with ``--jobs 2``, plus start-up and the last case's tail).

With ``--run``, each case is instead run as the default profile runs it (``runner.run_case`` at the case's own
design TV, m = ``--tests``, seed 1, the early pass on unless ``--no-early-pass``): verdict, trials against the cap and
CPU-seconds, what a clean case really costs once it may stop before its cap.

    OMP_NUM_THREADS=1 .venv/bin/python bench/suite_sensitivity.py [--trials 48] [--cases 'e2e/*'] [--tests 400]
    OMP_NUM_THREADS=1 .venv/bin/python bench/suite_sensitivity.py --run --cases e2e/dflash/plain
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import time
from typing import Any

import torch

from specwatch.evidence import designed_checks
from specwatch.runner import SuiteConfig, run_case, trial_cap
from specwatch.stats import design_epsilon, rejection_threshold
from specwatch.targets.loader import resolve

DEFAULT_CASES = ("e2e/*", "direct/far_apart/V8/g1", "direct/close/V64/g5", "direct/llm_like/V1024/g4")


def _bare_generate(experiment: Any, n: int) -> float:
    """CPU seconds of the bare ``generate()`` calls that draw ``n`` trials with the case's arguments (no observer, no
    laws, no counts): one call a trial, or ``rows_per_call`` rows of the same prompt a call where the case batches."""
    kwargs = experiment.generation_kwargs()
    rows = int(getattr(experiment, "rows_per_call", 1))
    prompt = experiment.prompt.expand(rows, -1)
    mask = torch.ones_like(prompt)
    torch.manual_seed(0)
    started = time.process_time()
    with torch.no_grad():
        for _ in range(math.ceil(n / rows)):
            experiment.target.generate(prompt, attention_mask=mask, **kwargs)
    return time.process_time() - started


def _bare_direct(experiment: Any, n: int) -> float:
    generator = torch.Generator().manual_seed(0)
    started = time.process_time()
    experiment.sampler(experiment.step, n, generator)
    return time.process_time() - started


def measure(target: Any, case: Any, trials: int, level: float, beta: float, designs: list[float]) -> dict[str, Any]:
    experiment = case.build(target.sampler, torch.device("cpu"))
    direct = hasattr(experiment, "step") and hasattr(experiment, "sampler")
    # Direct: many cheap calls; a batched plain-sampling case: several full calls of its rows.
    n = max(trials, 20_000) if direct else max(trials, 8 * int(getattr(experiment, "rows_per_call", 1)))
    generator = torch.Generator().manual_seed(1)
    experiment.run(2 if not direct else 64, generator)  # warm-up (first calls, one-time loads)
    started = time.process_time()
    experiment.run(n, generator)
    harness = (time.process_time() - started) / n
    bare = (_bare_direct(experiment, n) if direct else _bare_generate(experiment, n)) / n
    checks = designed_checks(experiment, case.epsilon)  # the checks that size the case at its own design
    reach = max(c.reach for c in checks)
    per_minute = 60.0 / harness
    tv = max(design_epsilon(c.support, per_minute * c.reach, level, beta) for c in checks)
    projected = {}
    for epsilon in designs:
        cap = trial_cap(experiment, SuiteConfig(epsilon=epsilon, beta=beta), epsilon, 1.0 / level)
        projected[epsilon] = cap * harness
    return {
        "case": case.id,
        "obs_per_cpu_s": reach / harness,
        "tv_per_cpu_min": tv,
        "ratio": harness / bare,
        "ms_per_trial": 1000 * harness,
        "projected": projected,
    }


def run_as_profiled(target: Any, case: Any, tests: int, *, early_pass: bool) -> str:
    """One line: the case run as the default profile runs it, with its CPU-seconds."""
    started = time.process_time()
    experiment = case.build(target.sampler, torch.device("cpu"))
    result = run_case(case, experiment, SuiteConfig(seed=1, early_pass=early_pass), tests)
    cpu = time.process_time() - started
    return f"{case.id:46} TV {case.epsilon:<5} {result.verdict.value:5} {result.n_trials:>9}/{result.trial_cap:<9} {cpu:8.1f} CPU-s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=48, help="generate() trials timed per path (harness and bare each)")
    parser.add_argument("--cases", action="append", help="glob of case ids (repeatable)")
    parser.add_argument("--tests", type=int, default=400, help="checks in the run (Bonferroni m) for the level")
    parser.add_argument("--alpha", type=float, default=1e-4)
    parser.add_argument("--beta", type=float, default=1e-3)
    parser.add_argument("--design", type=float, action="append", help="design TV values to project (default 0.1, 0.05, 0.03)")
    parser.add_argument("--run", action="store_true", help="run each case as the default profile does (trials, CPU-s)")
    parser.add_argument("--no-early-pass", action="store_true", help="with --run: run to the cap (no early pass)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    designs = args.design or [0.1, 0.05, 0.03]
    level = 1.0 / rejection_threshold(args.alpha, args.tests)
    target = resolve("transformers")
    patterns = args.cases or list(DEFAULT_CASES)
    cases = [c for c in target.cases if c.skip_reason is None and any(fnmatch.fnmatch(c.id, p) for p in patterns)]
    cases = [c for c in cases if not c.id.startswith("e2e/greedy/")]  # fixed 64 prompts: no design TV
    print(f"transformers {target.library.get('version')}; level alpha/m = {args.alpha}/{args.tests}, power {1 - args.beta}")
    if args.run:
        for case in cases:
            print(run_as_profiled(target, case, args.tests, early_pass=not args.no_early_pass), flush=True)
        return
    head = "".join(f"  CPU-s@{e:<5}" for e in designs)
    print(f"{'path':46} {'ms/trial':>9} {'obs/CPU-s':>10} {'TV/CPU-min':>11} {'ratio':>6}{head}")
    totals = dict.fromkeys(designs, 0.0)
    for case in cases:
        row = measure(target, case, args.trials, level, args.beta, designs)
        cells = "".join(f"  {row['projected'][e]:>11.1f}" for e in designs)
        figures = f"{row['ms_per_trial']:9.2f} {row['obs_per_cpu_s']:10.1f} {row['tv_per_cpu_min']:11.4f} {row['ratio']:6.2f}"
        print(f"{row['case']:46} {figures}{cells}", flush=True)
        for e in designs:
            totals[e] += row["projected"][e] if math.isfinite(row["projected"][e]) else 0.0
    cells = "".join(f"  {totals[e]:>11.1f}" for e in designs)
    print(f"{'total (these paths, CPU-s)':46} {'':9} {'':10} {'':11} {'':6}{cells}")


if __name__ == "__main__":
    main()
