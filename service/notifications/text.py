"""Alert entries in words, the same for Slack, the dashboard and the ``specwatch`` command line.

Much of an alert's text comes from the library under test, not from specwatch: the error text of an exception,
broken or uninstallable entry, a case's id and reason (the suite writes its result file inside the sandbox,
beside the code under test). :func:`mrkdwn` makes such text literal in Slack and short (issue 28, item 3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from service.textlimits import CUT_MARKER, cut
from specwatch.protocol import E_VALUE_CAP

__all__ = ["CUT_MARKER", "TEXT_MAX", "cut", "drift_range", "drift_text", "evidence_text", "mrkdwn"]

#: The most characters of one library-provided text in a message (an error's first line, a case id).
TEXT_MAX = 500


def mrkdwn(value: object, limit: int = TEXT_MAX) -> str:
    """``value`` as literal text inside Slack mrkdwn, at most ``limit`` characters before escaping: ``&``, ``<`` and
    ``>`` escaped, so ``<!channel>`` stays text and ``<https://x|dashboard>`` is no link (Slack's control
    characters, https://api.slack.com/reference/surfaces/formatting#escaping)."""
    return cut(str(value), limit).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _num(value: Any, spec: str) -> str:
    # Only numbers: an entry's figures come from a result file, and a string there must not reach a message.
    return format(value, spec) if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def drift_range(entry: Mapping[str, Any]) -> int | None:
    """The range [0, B] of one trial's accepted drafts that a drift entry was measured over (entries written
    before the suite reported it carry the case's ``gamma``); None: not a drift entry with a range."""
    value = entry.get("per_trial_max", entry.get("gamma"))
    return None if value is None else int(value)


def drift_text(entry: Mapping[str, Any]) -> str | None:
    """A drift entry in one line: the acceptance against its baseline, the significance radius and the per-trial
    range the Hoeffding bound used, and the earlier runs left out for another range. None for other entries."""
    if entry.get("reason") != "drift":
        return None
    bound = drift_range(entry)
    runs = entry.get("baseline_runs")
    over = f" over {_num(runs, ',')} run(s)" if runs is not None else ""
    text = (
        f"acceptance {_num(entry.get('acceptance_observed'), '.3f')} per trial vs baseline {_num(entry.get('baseline_mean'), '.3f')}"
        f"{over} ({_num(entry.get('baseline_trials'), ',')} trials): difference {_num(entry.get('difference'), '+.3f')}, "
        f"significant beyond {_num(entry.get('radius'), '.3f')} at alpha {_num(entry.get('alpha'), '.2g')}; "
        f"per-trial range [0, {'-' if bound is None else bound}]"
    )
    left_out = entry.get("baseline_left_out")
    if left_out:
        text += f"; {_num(left_out, ',')} earlier run(s) over another range left out"
    return text


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def evidence_text(entry: Mapping[str, Any]) -> str:
    """An entry's evidence: its e-value against the threshold. Past :data:`~specwatch.protocol.E_VALUE_CAP` the
    stored e-value is the cap (``1e+300``), not a measurement: then it says so, with log E against the log
    threshold (exact, as ``specwatch history`` shows them). No log E on a failing case: an impossible observation."""
    log_e, threshold, e_value = (_number(entry.get(key)) for key in ("log_e_value", "threshold", "e_value"))
    if entry.get("log_e_value") is None and entry.get("reason") != "drift":
        return f"e-value ∞ (impossible observation; threshold {_num(threshold, '.3g')})"
    if (log_e is not None and log_e >= math.log(E_VALUE_CAP)) or (e_value is not None and e_value >= E_VALUE_CAP):
        log_threshold = _num(math.log(threshold), ".4g") if threshold is not None and threshold > 0 else "-"
        figures = f"log E {_num(log_e, '.4g')} ≥ log threshold {log_threshold}"
        return f"e-value capped, far beyond the threshold {_num(threshold, '.3g')} ({figures})"
    return f"e-value {_num(e_value, '.3g')} (threshold {_num(threshold, '.3g')})"
