"""Alert text helpers (issue 28, item 3): literal mrkdwn, cut with a marker, figures only when they are numbers."""

from __future__ import annotations

import pytest

from service.notifications.text import CUT_MARKER, cut, drift_text, evidence_text, mrkdwn

pytestmark = pytest.mark.unit


def test_mrkdwn_escapes_slacks_control_characters() -> None:
    assert mrkdwn("<!channel> & <https://x.example|here>") == "&lt;!channel&gt; &amp; &lt;https://x.example|here&gt;"


def test_cut_keeps_short_text_and_marks_a_cut_one() -> None:
    assert cut("abc", 3) == "abc"
    assert cut("x" * 100, 20) == "x" * (20 - len(CUT_MARKER)) + CUT_MARKER
    assert len(cut("x" * 100, 20)) == 20


def test_mrkdwn_cuts_before_escaping() -> None:
    assert mrkdwn("<" * 1000, 20) == "&lt;" * (20 - len(CUT_MARKER)) + CUT_MARKER


def test_drift_text_shows_no_string_figures() -> None:
    entry = {"reason": "drift", "acceptance_observed": "<!channel>", "baseline_mean": 0.5, "baseline_runs": "<!here>", "per_trial_max": 4}
    text = drift_text(entry)
    assert text is not None
    assert "<!" not in text
    assert "vs baseline 0.500" in text


def test_a_capped_e_value_says_it_is_capped_not_1e300() -> None:
    """The suite stores e-values past 1e300 as 1e300 (JSON has no infinity): the message says the e-value is
    capped and shows log E against the log threshold instead of a made-up number (issue 26)."""
    entry = {"case_id": "c", "reason": "lossless", "e_value": 1e300, "log_e_value": 2118.3, "threshold": 2e5}
    text = evidence_text(entry)
    assert "1e+300" not in text
    assert "capped" in text
    assert "log E 2118 ≥ log threshold 12.21" in text
    assert "threshold 2e+05" in text


def test_an_ordinary_e_value_and_an_impossible_observation() -> None:
    assert (
        evidence_text({"reason": "lossless", "e_value": 1e9, "log_e_value": 20.7, "threshold": 1.2e5})
        == "e-value 1e+09 (threshold 1.2e+05)"
    )
    assert evidence_text({"reason": "lossless", "e_value": None, "log_e_value": None, "threshold": 1e4}).startswith("e-value ∞")
    assert "<" not in evidence_text({"reason": "lossless", "e_value": "<!channel>", "log_e_value": 3.0, "threshold": "<!here>"})
