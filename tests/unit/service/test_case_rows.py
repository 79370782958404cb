"""A run's case rows: the behaviour mark against the previous tested commit."""

from __future__ import annotations

import pytest

from service.models import CaseResult, Verdict
from service.queries.runs import _case_row


@pytest.mark.parametrize(
    ("now", "before", "same"),
    [("fp-a", "fp-a", True), ("fp-a", "fp-b", False), ("fp-a", None, None), ("", "", None), ("fp-a", "", None), ("", "fp-a", None)],
)
def test_same_as_previous_needs_a_fingerprint_on_both_sides(now: str, before: str | None, same: bool | None) -> None:
    """Skipped and errored cases store an empty fingerprint: no output, so no "unchanged"."""
    result = CaseResult(case_id="c", verdict=Verdict.PASS, fingerprint=now)
    previous = {} if before is None else {"c": before}
    assert _case_row(result, previous).same_as_previous is same


def test_the_coverage_of_a_case_result_reaches_its_row_and_a_one_line_summary() -> None:
    coverage = {
        "drafts": {"0": 4, "1": 2, "3": 30},
        "accepted": {"0": 20, "3": 5},
        "rounds": {"3": 2, "5": 8},
        "full": 5,
        "partial": 9,
        "design": {"min_drafts": 2, "min_rounds": 3},
        "shortfalls": [],
    }
    row = _case_row(CaseResult(case_id="c", verdict=Verdict.PASS, fingerprint="f", details={"coverage": coverage}), {})
    assert row.coverage == coverage
    assert row.coverage_summary == "drafts<=3 full 5 partial 9 rounds 3-5"
    short = _case_row(CaseResult(case_id="c", verdict=Verdict.PASS, details={"coverage": {**coverage, "shortfalls": ["x"]}}), {})
    assert short.coverage_summary.endswith("(short of design)")
    assert _case_row(CaseResult(case_id="c", verdict=Verdict.PASS, details={}), {}).coverage_summary == "-"
