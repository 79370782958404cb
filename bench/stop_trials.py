"""Trials per case of two runs of the same cases (prints figures, asserts nothing): issue 39's stop rule (a case stops
once every designed check passed early or has its planned observations, docs/statistics.md §7a) against a run before it.

Each argument is a run result as ``python -m specwatch run ... --json FILE`` writes it (any readable schema). Per case:
trials and cap of each run, how each stopped (``stopped_by``, or for a result before schema 7: ``early`` when it
passed early, ``cap`` when it ran to its cap, ``failed``), the ratio of trials, and for the second run how its designed
checks were done (``p``: by the pass statistic, ``o``: by their planned observations). Run (seed fixed)::

    OMP_NUM_THREADS=1 PYTHONPATH=OLD python -m specwatch run --target reference --quick --seed 0 --json before.json
    OMP_NUM_THREADS=1 PYTHONPATH=NEW python -m specwatch run --target reference --quick --seed 0 --json after.json
    python bench/stop_trials.py before.json after.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specwatch.protocol import CaseResult, RunResult, Verdict


def _stop(case: CaseResult) -> str:
    if case.stopped_by is not None:
        return case.stopped_by.value
    if case.verdict == Verdict.FAIL and case.n_trials < case.trial_cap:
        return "failed"
    return "early" if case.early_pass else ("cap" if case.n_trials >= case.trial_cap else "?")


def _done(case: CaseResult) -> str:
    """How the designed checks were done: p by the pass statistic, o by their planned observations, - neither."""
    marks = []
    for check in case.checks:
        if not check.designed:
            continue
        marks.append("o" if check.planned_at is not None and check.planned_at <= case.n_trials else "p" if check.passed_at else "-")
    return "".join(marks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    before, after = (RunResult.from_json(json.loads(path.read_text())) for path in (args.before, args.after))
    old = {c.case_id: c for c in before.results}
    print(f"before: suite {before.suite_version}, seed {before.seed}; after: suite {after.suite_version}, seed {after.seed}")
    print(f"{'case':<50} {'before':>9} {'cap':>9} {'stop':>7} {'after':>9} {'cap':>9} {'stop':>12} {'ratio':>6}  checks")
    totals = [0, 0]
    for case in after.results:
        prior = old.get(case.case_id)
        if prior is None or (case.n_trials == 0 and prior.n_trials == 0):
            continue
        totals[0] += prior.n_trials
        totals[1] += case.n_trials
        ratio = case.n_trials / prior.n_trials if prior.n_trials else float("nan")
        verdicts = "" if prior.verdict == case.verdict else f"  verdict {prior.verdict.value} -> {case.verdict.value}"
        print(
            f"{case.case_id:<50} {prior.n_trials:>9,} {prior.trial_cap:>9,} {_stop(prior):>7} {case.n_trials:>9,} "
            f"{case.trial_cap:>9,} {_stop(case):>12} {ratio:>6.2f}  {_done(case)}{verdicts}"
        )
    print(f"{'total':<50} {totals[0]:>9,} {'':>9} {'':>7} {totals[1]:>9,} {'':>9} {'':>12} {totals[1] / max(totals[0], 1):>6.2f}")
    print(f"run duration: before {before.duration_s:.1f} s, after {after.duration_s:.1f} s")


if __name__ == "__main__":
    main()
