"""What designing the end-to-end sampling cases at a smaller TV costs a clean run (prints figures, asserts nothing).

A clean end-to-end case stops once both its PIT checks (``lossless/pit_id`` and ``lossless/pit_prob``: PIT_BINS uniform
cells, ``horizon`` observations per trial, docs/statistics.md §7a) passed early or have their planned observations.
Under the null that point depends on nothing but (epsilon, bins, horizon, the run's m / alpha): this script finds it by
running the suite's own runner (``runner.run_case_once``, the early pass, its batches and holds) on an experiment whose
PIT counts are exact null draws, ``--reps`` times per epsilon.

Given a run result (``specwatch check ... --json FILE``), it then predicts that run's wall time with its end-to-end
sampling cases designed at each epsilon: each such case's seconds per trial from the run, times the simulated mean
trials; every other case as measured; the cases handed to ``--jobs`` processes in the runner's order
(``parallel.longest_first``, the next case to the first free process). Run::

    specwatch check --pip transformers==5.24.0 --jobs 2 --json run.json
    OMP_NUM_THREADS=1 python bench/e2e_epsilon_cost.py run.json --epsilon 0.03 0.025 0.02 --jobs 2
"""

from __future__ import annotations

import argparse
import heapq
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.cases import Case
from specwatch.conditional import PIT_BINS, TokenOrder, pit_null
from specwatch.experiments import CheckSpec, Observation
from specwatch.parallel import longest_first
from specwatch.protocol import Layer, Verdict
from specwatch.runner import SuiteConfig, run_case_once

#: The wall time the issue asks the default profile to stay within.
TARGET_S = 600.0


@dataclass
class NullPit:
    """An end-to-end case's designed checks under the null: two PIT checks of ``bins`` uniform cells, ``horizon``
    observations per trial, drawn exactly (a multinomial per batch)."""

    horizon: int
    bins: int = PIT_BINS
    expected_acceptance: float | None = None
    accepted_per_trial_max: int | None = None
    fixed_trials: int | None = None

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return tuple(CheckSpec(f"lossless/pit_{o.value}", Layer.LOSSLESS, pit_null(self.bins), float(self.horizon)) for o in TokenOrder)

    def run(self, n: int, generator: torch.Generator) -> Observation:
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))
        counts = {c.name: rng.multinomial(n * self.horizon, c.null).astype(np.int64) for c in self.checks}
        return Observation(counts, (), 0, b"")


def null_trials(epsilon: float, *, horizon: int, tests: int, alpha: float, reps: int) -> tuple[NDArray[np.float64], int]:
    """Trials at which a clean case stopped in each of ``reps`` runs, and its cap."""
    case = Case(
        id="e2e/null_pit", family="e2e", description="null PIT counts", epsilon=epsilon, make_experiment=lambda _d: NullPit(horizon)
    )
    stops, cap = [], 0
    for rep in range(reps):
        result = run_case_once(case, NullPit(horizon), SuiteConfig(alpha=alpha, seed=rep), tests)
        if result.verdict is not Verdict.PASS:
            raise SystemExit(f"epsilon {epsilon}, rep {rep}: a null run did not pass ({result.reason})")
        stops.append(result.n_trials)
        cap = result.trial_cap
    return np.asarray(stops, dtype=np.float64), cap


def e2e_sampling(case: dict[str, object]) -> bool:
    """A clean end-to-end sampling case of the run: its trials scale with the design (greedy ones run 64 prompts)."""
    case_id = str(case["case_id"])
    return case_id.startswith("e2e/") and not case_id.startswith("e2e/greedy/") and case["verdict"] == "pass"


def runner_order(cases: Sequence[dict[str, object]]) -> list[str]:
    """The run's case ids in the order the runner starts them (``parallel.longest_first``)."""
    items = [(i, Case(id=str(c["case_id"]), family=str(c["family"]), description="", epsilon=0.0)) for i, c in enumerate(cases)]
    return [case.id for _, case in longest_first(items)]


def wall(seconds: Sequence[float], jobs: int) -> float:
    """List scheduling of cases taking ``seconds``, in that order, each to the first free of ``jobs`` processes."""
    free = [0.0] * jobs
    for s in seconds:
        heapq.heappush(free, heapq.heappop(free) + s)
    return max(free)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run result (--json) of the target at its current design")
    parser.add_argument("--epsilon", type=float, nargs="+", default=[0.03, 0.025, 0.02])
    parser.add_argument("--horizon", type=int, default=10, help="PIT observations per trial (transformers: E2E_HORIZON)")
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    run = json.loads(args.run.read_text())
    cases = run["results"]
    order = runner_order(cases)
    measured = {str(c["case_id"]): float(c["duration_s"]) for c in cases}
    per_trial = {str(c["case_id"]): float(c["duration_s"]) / int(c["n_trials"]) for c in cases if e2e_sampling(c)}
    e2e_s, rest_s = sum(measured[i] for i in per_trial), sum(s for i, s in measured.items() if i not in per_trial)
    print(
        f"{args.run}: {len(cases)} cases, {len(per_trial)} clean e2e sampling cases ({e2e_s:.0f} CPU-s), the rest {rest_s:.0f} "
        f"CPU-s; run {float(run['duration_s']):.0f} s, scheduled {wall([measured[i] for i in order], args.jobs):.0f} s "
        f"(m = {run['tests']}, alpha = {run['alpha']})"
    )
    print(
        f"{'epsilon':>8} {'cap':>6} {'stop: mean':>10} {'sd':>6} {'q10':>6} {'q90':>6} {'e2e CPU-s':>10} {'wall s':>7} "
        f"{'x faster for 600 s':>19}"
    )
    for epsilon in args.epsilon:
        started = time.perf_counter()
        stops, cap = null_trials(epsilon, horizon=args.horizon, tests=int(run["tests"]), alpha=float(run["alpha"]), reps=args.reps)
        mean = float(stops.mean())

        def predicted_wall(speedup: float, mean: float = mean) -> float:
            """The run's wall time with every e2e trial ``speedup`` x cheaper and each e2e case stopping at ``mean``."""
            return wall([per_trial[i] * mean / speedup if i in per_trial else measured[i] for i in order], args.jobs)

        # The factor by which a trial of every e2e case would have to get cheaper for the run to end within TARGET_S.
        needed = "-"
        if predicted_wall(1.0) > TARGET_S:
            lo, hi = 1.0, 64.0
            for _ in range(40):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if predicted_wall(mid) <= TARGET_S else (mid, hi)
            needed = f"{hi:.2f}"
        q10, q90 = np.quantile(stops, [0.1, 0.9])
        print(
            f"{epsilon:>8} {cap:>6} {mean:>10.0f} {stops.std(ddof=1):>6.0f} {q10:>6.0f} {q90:>6.0f} "
            f"{sum(per_trial.values()) * mean:>10.0f} {predicted_wall(1.0):>7.0f} {needed:>19}   ({time.perf_counter() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
