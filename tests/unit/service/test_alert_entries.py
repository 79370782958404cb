"""Alert entries: a tagged union by ``reason``, checked when read back from the database."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.models.entries import alert_entries

FIGURES = dict.fromkeys(("e_value", "log_e_value", "tv_estimate", "acceptance_observed", "acceptance_expected", "n_trials"))


@pytest.mark.unit
def test_each_reason_reads_as_its_own_shape() -> None:
    stored = [
        {"case_id": "direct/a", "reason": "lossless", "threshold": 1e5, **FIGURES, "e_value": 3.0},
        {"case_id": "direct/b", "reason": "raised", "error": "ValueError: nope"},
        {"case_id": "(suite)", "reason": "broken", "error": "ImportError"},
        {"case_id": "(install)", "reason": "uninstallable", "requirement": "kernels>=0.19", "error": "could not install"},
        {"case_id": "(target)", "reason": "configuration", "error": "repository not found"},
    ]
    entries = alert_entries(stored)
    assert [e["reason"] for e in entries] == ["lossless", "raised", "broken", "uninstallable", "configuration"]
    assert entries[0]["e_value"] == 3.0


@pytest.mark.unit
def test_an_entry_written_before_raised_had_its_name_reads_as_raised() -> None:
    (entry,) = alert_entries([{"case_id": "direct/b", "reason": "exception", "error": "ValueError: nope"}])
    assert entry["reason"] == "raised"


@pytest.mark.unit
@pytest.mark.parametrize(
    "bad",
    [
        {"case_id": "direct/a", "reason": "lossless", "threshold": 1e5, **FIGURES, "e_value": "<!channel>"},  # text where a number goes
        {"case_id": "direct/a", "reason": "whatever", "error": "x"},  # an unknown reason
        {"case_id": "(suite)", "reason": "broken"},  # its error missing
    ],
)
def test_a_malformed_entry_is_refused_on_read(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        alert_entries([bad])
