"""How fast the suite turns trials into decisions, in one process and in N processes.

Prints, per direct case, trials/s of the full harness (``run_case``: counting, e-process after every
batch, result) against a bare loop of the same sampler calls in the same batches, for the reference
sampler and for transformers' ``_speculative_sampling`` adapter; then end-to-end ``generate()`` calls/s
with the tiny models. Each figure for 1 process and for N processes (one thread each) running the
same work side by side (aggregate rate).

    OMP_NUM_THREADS=1 .venv/bin/python bench/suite_throughput.py [--processes 2] [--trials 200000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from specwatch.cases import CASES, Case
from specwatch.runner import SuiteConfig, run_case
from specwatch.sampling import Sampler, reference_sampler

DIRECT = ("direct/far_apart/V64/g3", "direct/llm_like/V1024/g4")


def _batches(total: int) -> list[int]:
    sizes, size, done = [], 1024, 0
    while done < total:
        sizes.append(min(size, total - done))
        done += sizes[-1]
        size = min(2 * size, 1 << 16)
    return sizes


def _sampler(kind: str) -> Sampler:
    if kind == "reference":
        return reference_sampler
    from specwatch.targets.transformers.adapter import TransformersAdapter

    return TransformersAdapter.load().sampler()


def bare(kind: str, case_id: str, trials: int) -> float:
    """Trials/s of the sampler alone, called in the harness's batch sizes."""
    torch.set_num_threads(1)
    case, sampler = _case(case_id), _sampler(kind)
    step, generator = case.step(), torch.Generator().manual_seed(0)
    started = time.perf_counter()
    for n in _batches(trials):
        sampler(step, n, generator)
    return trials / (time.perf_counter() - started)


def harness(kind: str, case_id: str, trials: int) -> float:
    """Trials/s through run_case, capped at ``trials`` (max_trials), e-process after every batch."""
    torch.set_num_threads(1)
    case, sampler = _case(case_id), _sampler(kind)
    experiment = case.build(sampler, torch.device("cpu"))
    started = time.perf_counter()
    result = run_case(case, experiment, SuiteConfig(max_trials=trials, epsilon=0.001), len(experiment.checks))
    return result.n_trials / (time.perf_counter() - started)


def generate_calls(case_id: str, calls: int) -> float:
    """generate() calls/s of an end-to-end case's experiment."""
    torch.set_num_threads(1)
    from specwatch.targets.loader import resolve

    case = next(c for c in resolve("transformers").cases if c.id == case_id)
    experiment = case.build(reference_sampler, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    started = time.perf_counter()
    experiment.run(calls, generator)
    return calls / (time.perf_counter() - started)


def _case(case_id: str) -> Case:
    case = next(c for c in CASES if c.id == case_id)
    return replace(case)


def in_parallel(fn: Callable[..., float], args: tuple[object, ...], processes: int) -> float:
    """Aggregate rate of ``processes`` copies of ``fn(*args)`` running side by side."""
    if processes == 1:
        return fn(*args)
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return sum(pool.starmap(fn, [args] * processes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--trials", type=int, default=200_000, help="direct trials per measurement (reference)")
    parser.add_argument("--library-trials", type=int, default=20_000, help="direct trials through transformers")
    parser.add_argument("--calls", type=int, default=300, help="generate() calls per end-to-end measurement")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, one thread per process; N = {args.processes}")
    print(f"{'sampler':13} {'case':28} {'procs':>5} {'bare/s':>11} {'harness/s':>11} {'bare/harness':>12}")
    for kind, trials in (("reference", args.trials), ("transformers", args.library_trials)):
        for case_id in DIRECT:
            for processes in (1, args.processes):
                b = in_parallel(bare, (kind, case_id, trials), processes)
                h = in_parallel(harness, (kind, case_id, trials), processes)
                print(f"{kind:13} {case_id:28} {processes:>5} {b:>11,.0f} {h:>11,.0f} {b / h:>12.2f}", flush=True)
    print(f"\n{'end-to-end case':34} {'procs':>5} {'generate calls/s':>17}")
    for case_id in ("e2e/control/processed", "e2e/assistant_model/processed", "e2e/prompt_lookup/processed"):
        for processes in (1, args.processes):
            rate = in_parallel(generate_calls, (case_id, args.calls), processes)
            print(f"{case_id:34} {processes:>5} {rate:>17.1f}", flush=True)


if __name__ == "__main__":
    main()
