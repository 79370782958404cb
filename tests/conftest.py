"""Shared test configuration: one thread per process, markers by folder, GPU tests skipped without CUDA.

The PostgreSQL and worker fixtures are plugins (tests/support/postgres.py, tests/support/workers.py), so
integration and end-to-end tests share one definition of each.

Under ``make test`` (``SPECWATCH_TEST_FORBID_SKIPS=1``) every tool and service a test needs is there by
construction (scripts/test-deps.sh), so a skipped test is a failure: only GPU tests may skip, for want of CUDA.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = ["tests.support.postgres", "tests.support.workers"]

_FOLDER_MARKERS = {"unit": pytest.mark.unit, "integration": pytest.mark.integration, "e2e": pytest.mark.e2e}
FORBID_SKIPS = os.environ.get("SPECWATCH_TEST_FORBID_SKIPS") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda = _cuda_available()
    for item in items:
        parts = Path(str(item.fspath)).relative_to(Path(__file__).parent).parts
        if parts and parts[0] in _FOLDER_MARKERS:
            item.add_marker(_FOLDER_MARKERS[parts[0]])
        if "gpu" in item.keywords and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs CUDA"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if FORBID_SKIPS and report.skipped and not hasattr(report, "wasxfail") and "gpu" not in item.keywords:
        _fail_the_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if FORBID_SKIPS and report.skipped:  # a whole module skipped (pytest.importorskip, a module-level skip)
        _fail_the_skip(report)
    return report


def _fail_the_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped, and nothing may skip under make test (SPECWATCH_TEST_FORBID_SKIPS=1): {reason}"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
