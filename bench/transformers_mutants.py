"""Trials to detect each library-level transformers mutant: the earlier e2e design against the new one.

For every mutant in ``specwatch.targets.transformers.mutants`` and seed, in a fresh process (the patch
is process-wide) with the mutant planted in the installed transformers:

* old: ``generate(max_new_tokens=2)`` with the library's drafting defaults, the joint law of the first two
  tokens only (the suite's design before the long-horizon checks);
* new: the case as the catalogue builds it (10 tokens, 3 drafts per verification, the joint law plus the
  conditional PIT checks under two orders).

Each runs the suite's sequential procedure (batches of 16, 32, 64, ... trials, so trials to detect are
read at batch ends) at the quick profile's TV 0.1 with the run's Bonferroni m set
to what a quick transformers run has, and prints: caught or not, trials run until the lossless rejection
(at a batch end) or the cap, the accepted drafts per call and, for the new design, the drafts-per-verification
histogram. A lossless mutant must pass both and show its acceptance change.

With ``--design E`` (repeatable) it runs instead the case as the catalogue builds it at each design TV E (the
earlier default, 0.1, beside the default profile's 0.03), at the m of a default transformers run (``--tests``):
verdict, trials at the rejection or the cap, and the checks rejecting.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/transformers_mutants.py [--seeds 3] [--max-trials 3000]
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/transformers_mutants.py --mutants processors_skip_some_rows \
        --design 0.1 --design 0.03
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from typing import Any

#: Checks in a quick transformers run on 5.24.0 (the m of the e-Bonferroni threshold).
QUICK_TESTS = 150
#: Checks in a default transformers run on 5.24.0.
DEFAULT_TESTS = 400


class _FirstTokensOnly:
    """The earlier design: only the joint law of the first tokens, which then sizes the cap."""

    probe_trials = 48
    expected_acceptance = None
    accepted_per_trial_max = None
    fixed_trials = None

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.checks = (replace(inner.checks[0], designed=True),)

    def run(self, n: int, generator: Any) -> Any:
        return replace(self.inner.run(n, generator), coverage=None)


def _designed(mutant: str, seed: int, designs: list[float], tests: int) -> dict[str, Any]:
    """The catalogue's case at each design TV (default profile, batches from 16 trials)."""
    import torch

    from specwatch.runner import SuiteConfig, run_case
    from specwatch.targets.loader import resolve
    from specwatch.targets.transformers.mutants import LIBRARY_MUTANTS

    torch.set_num_threads(1)
    target = resolve(f"transformers+mutant:{mutant}")
    case_id = LIBRARY_MUTANTS[mutant].cases[-1]
    case = next(c for c in target.cases if c.id == case_id)
    out: dict[str, Any] = {"mutant": mutant, "case": case_id, "seed": seed}
    for epsilon in designs:
        config = SuiteConfig(seed=seed, epsilon=epsilon, first_batch=16)
        result = run_case(case, case.build(target.sampler, torch.device("cpu")), config, tests)
        out[str(epsilon)] = {
            "verdict": result.verdict.value,
            "trials": result.n_trials,
            "cap": result.trial_cap,
            "rejected": [c.name for c in result.checks if c.rejected],
        }
    return out


def _one(mutant: str, seed: int, max_trials: int) -> dict[str, Any]:
    import torch

    from specwatch.cases import Case
    from specwatch.runner import SuiteConfig, run_case
    from specwatch.sampling import Processing
    from specwatch.targets.loader import resolve
    from specwatch.targets.transformers.adapter import PROCESSING_ON
    from specwatch.targets.transformers.experiments import E2E_COVERAGE, GenerateExperiment
    from specwatch.targets.transformers.mutants import LIBRARY_MUTANTS

    torch.set_num_threads(1)
    target = resolve(f"transformers+mutant:{mutant}")
    case_id = LIBRARY_MUTANTS[mutant].cases[-1]
    case = next(c for c in target.cases if c.id == case_id)
    module = importlib_transformers()
    processing = PROCESSING_ON if case_id.endswith("processed") else Processing()
    options: dict[str, Any] = {"assistant_model": True} if "assistant_model" in case_id else {"prompt_lookup_num_tokens": 3}
    device = torch.device("cpu")
    old = _FirstTokensOnly(GenerateExperiment(module, processing, options, device, horizon=2, tuned=False, coverage=E2E_COVERAGE))
    new = case.build(target.sampler, device)
    # Batches from 16 trials, doubling: a rejection is seen at 16, 48, 112, 240, ... trials (the caps stay
    # what each design plans).
    config = SuiteConfig(seed=seed, quick=True, max_trials=max_trials, first_batch=16)
    out: dict[str, Any] = {"mutant": mutant, "case": case_id, "seed": seed}
    for label, experiment in (("old", old), ("new", new)):
        result = run_case(Case(id=case_id, family="e2e", description="", epsilon=0.1), experiment, config, QUICK_TESTS)
        rejected = [c.name for c in result.checks if c.rejected]
        out[label] = {
            "verdict": result.verdict.value,
            "lossless": result.lossless.value,
            "trials": result.n_trials,
            "cap": result.trial_cap,
            "rejected": rejected,
            "acceptance": result.acceptance.observed,
            "drafts": (result.coverage or {}).get("drafts"),
        }
    return out


def importlib_transformers() -> Any:
    import importlib

    return importlib.import_module("transformers")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-trials", type=int, default=3000)
    parser.add_argument("--mutants", nargs="*", default=None)
    parser.add_argument("--design", type=float, action="append", help="run the catalogue case at this design TV (repeatable)")
    parser.add_argument("--tests", type=int, default=DEFAULT_TESTS, help="m of the run for --design")
    parser.add_argument("--one", nargs=2, metavar=("MUTANT", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one and args.design:
        print(json.dumps(_designed(args.one[0], int(args.one[1]), args.design, args.tests)))
        return
    if args.one:
        print(json.dumps(_one(args.one[0], int(args.one[1]), args.max_trials)))
        return
    from specwatch.targets.transformers.mutants import LIBRARY_MUTANTS

    names = args.mutants or list(LIBRARY_MUTANTS)
    if args.design:
        _print_designed(names, args)
        return
    header = f"{'mutant':32} {'lossless?':9} {'seed':>4}  {'old: verdict trials':>24}  {'new: verdict trials':>24}  new checks rejecting"
    print(header)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in names:
        for seed in range(1, args.seeds + 1):
            command = [sys.executable, __file__, "--one", name, str(seed), "--max-trials", str(args.max_trials)]
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            if done.returncode != 0:
                print(f"{name:32} error: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            old, new = r["old"], r["new"]
            print(
                f"{name:32} {'yes' if LIBRARY_MUTANTS[name].lossless else 'no':9} {seed:>4}  "
                f"{old['verdict']:>6} {old['trials']:>6}/{old['cap']:<6} acc {old['acceptance'] or 0:.2f}  "
                f"{new['verdict']:>6} {new['trials']:>6}/{new['cap']:<6} acc {new['acceptance'] or 0:.2f}  "
                f"{','.join(new['rejected']) or '-'}  drafts {new['drafts']}",
                flush=True,
            )


def _print_designed(names: list[str], args: argparse.Namespace) -> None:
    print(f"{'mutant':28} {'case':30} {'seed':>4}  " + "  ".join(f"{'TV ' + str(e) + ': verdict trials/cap':>32}" for e in args.design))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    designs = [a for e in args.design for a in ("--design", str(e))]
    for name in names:
        for seed in range(1, args.seeds + 1):
            command = [sys.executable, __file__, "--one", name, str(seed), "--tests", str(args.tests), *designs]
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            if done.returncode != 0:
                print(f"{name:28} error: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            cells = []
            for e in args.design:
                d = r[str(e)]
                cells.append(f"{d['verdict']:>6} {d['trials']:>6}/{d['cap']:<6} {','.join(d['rejected']) or '-':>16}")
            print(f"{name:28} {r['case']:30} {seed:>4}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
