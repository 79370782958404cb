"""A run's case rows: the behaviour mark against the previous tested commit."""

from __future__ import annotations

import pytest

from service.models import CaseResult, Verdict
from service.queries import _case_row


@pytest.mark.parametrize(
    ("now", "before", "same"),
    [("fp-a", "fp-a", True), ("fp-a", "fp-b", False), ("fp-a", None, None), ("", "", None), ("fp-a", "", None), ("", "fp-a", None)],
)
def test_same_as_previous_needs_a_fingerprint_on_both_sides(now: str, before: str | None, same: bool | None) -> None:
    """Skipped and errored cases store an empty fingerprint: no output, so no "unchanged"."""
    result = CaseResult(case_id="c", verdict=Verdict.pass_, fingerprint=now)
    previous = {} if before is None else {"c": before}
    assert _case_row(result, previous).same_as_previous is same
