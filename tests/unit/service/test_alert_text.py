"""Alert text helpers (issue 28, item 3): literal mrkdwn, cut with a marker, figures only when they are numbers."""

from __future__ import annotations

import pytest

from service.alert_text import CUT_MARKER, cut, drift_text, mrkdwn

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
