"""Run classification and case gamma (workers.analysis.decisions)."""

from __future__ import annotations

import pytest

from service.models import AlertKind
from workers.analysis.decisions import CaseOutcome, case_gamma, classify

LOSSY = CaseOutcome("direct/a/V8/g1", "fail", lossless=False, conformance=False)
SLOWER = CaseOutcome("direct/b/V8/g3", "fail", lossless=True, conformance=False)
FINE = CaseOutcome("direct/c/V8/g3", "pass", lossless=True, conformance=True)


@pytest.mark.parametrize(
    ("status", "cases", "expected"),
    [
        ("passed", [FINE], (None, [])),
        ("failed", [FINE, SLOWER], (AlertKind.performance, ["direct/b/V8/g3"])),
        # Every failing case is named, worst first: the conformance-only one beside a lossy one is not dropped.
        ("failed", [SLOWER, LOSSY], (AlertKind.violation, ["direct/a/V8/g1", "direct/b/V8/g3"])),
        ("error", [LOSSY], (AlertKind.broken, [])),  # a broken commit is never a violation
        ("error", [], (AlertKind.broken, [])),
        # Could not install, however often retried: neither broken nor a violation.
        ("uninstallable", [], (AlertKind.uninstallable, [])),
    ],
)
def test_classify(status: str, cases: list[CaseOutcome], expected: tuple[AlertKind | None, list[str]]) -> None:
    assert classify(status, cases) == expected


@pytest.mark.parametrize(("case_id", "gamma"), [("direct/far_apart/V8/g3", 3), ("e2e/x/g12/topk", 12), ("control/plain", None)])
def test_case_gamma(case_id: str, gamma: int | None) -> None:
    assert case_gamma(case_id) == gamma
