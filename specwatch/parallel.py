"""Run cases in several processes (one thread each): the suite's way to use every core.

Each worker process resolves the target from its spec once and rebuilds a case's experiment from
the case id, so nothing but ids, configuration and frozen results crosses process boundaries.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed

import torch

from specwatch.cases import Case, large_vocabulary
from specwatch.protocol import CaseResult
from specwatch.runner import SuiteConfig, error_result, run_case
from specwatch.targets.loader import Target, resolve

_TARGET: Target | None = None


def _initialise(spec: str) -> None:
    global _TARGET  # noqa: PLW0603 - one resolved target per worker process
    torch.set_num_threads(1)
    _TARGET = resolve(spec)


def _run_one(case_id: str, index: int, total: int, config: SuiteConfig, tests: int) -> CaseResult:
    if _TARGET is None:
        raise RuntimeError("worker process was not initialised")
    case = next(c for c in _TARGET.cases if c.id == case_id)
    try:
        experiment = case.build(_TARGET.sampler, torch.device(config.device))
        return run_case(case, experiment, config, tests, index=index, total=total)
    except Exception as exc:  # noqa: BLE001 - a crashing target is that case's error
        return error_result(case, config, tests, exc, 0.0)


def longest_first(items: Sequence[tuple[int, Case]]) -> list[tuple[int, Case]]:
    """Cases in the order to start them: those over a large vocabulary (a direct case of 50,257 tokens runs 130,000
    trials or more that cannot pass early, 200-330 s, the longest of a run), then the end-to-end sampling cases
    (thousands of ``generate()`` calls, 30-140 s), then the greedy ones (64 prompts), then the other direct and edge
    cases (seconds to half a minute), catalogue order within each group, so that the processes run out of work
    together instead of one waiting on a long case started last."""

    def group(case: Case) -> int:
        if large_vocabulary(case):
            return 0
        if case.family != "e2e":
            return 3
        return 2 if case.id.startswith("e2e/greedy/") else 1

    return sorted(items, key=lambda item: group(item[1]))


class ProcessPool:
    """A ``CasePool`` of ``jobs`` spawned processes testing the target named by ``spec``."""

    def __init__(self, spec: str, jobs: int) -> None:
        self._executor = ProcessPoolExecutor(
            max_workers=jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_initialise, initargs=(spec,)
        )

    def run(self, items: Sequence[tuple[int, Case]], config: SuiteConfig, tests: int) -> Iterator[tuple[int, CaseResult]]:
        total = len(items)
        futures: dict[Future[CaseResult], int] = {
            self._executor.submit(_run_one, case.id, index, total, config, tests): index for index, case in longest_first(items)
        }
        for future in as_completed(futures):
            yield futures[future], future.result()

    def cancel(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
