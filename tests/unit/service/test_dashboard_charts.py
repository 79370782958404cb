"""The case page's charts read at a glance: the e-value chart is log E relative to the threshold, clipped, so
one huge rejection neither hides the threshold nor squashes the passing commits; the TV and acceptance axes
start at 0 and say their units."""

from __future__ import annotations

import math
import re

import pytest

from service.dashboard import EVIDENCE_CLIP, case_charts
from service.dashboard.charts import BEYOND_LABEL_W, BOTTOM, HEIGHT, RIGHT, TOP, WIDTH, Axis, Chart, Rule, Series, render
from service.models import Verdict
from service.queries import CaseHistory, HistoryPoint

pytestmark = pytest.mark.unit

THRESHOLD = 3.0e4
BOTTOM_Y = HEIGHT - BOTTOM  # the plot's bottom edge


def point(order: int, log_e: float | None, *, fail: bool = False, tv: float = 0.004, acceptance: float = 0.71) -> HistoryPoint:
    return HistoryPoint(
        sha=f"{order:040x}",
        branch_order=order,
        run_id=order,
        verdict=Verdict.FAIL if fail else Verdict.PASS,
        log_e_value=log_e,
        threshold=THRESHOLD,
        tv_estimate=tv,
        tv_low=0.0,
        tv_high=tv + 0.01,
        acceptance_observed=acceptance,
        acceptance_expected=0.71,
        fingerprint=None,
    )


def history(*points: HistoryPoint, case_id: str = "direct/x/V8/g1") -> CaseHistory:
    return CaseHistory(target="toy", branch="main", case_id=case_id, points=points)


def circles(svg: str) -> list[float]:
    return [float(y) for y in re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)"', svg)]


def rule_y(svg: str) -> float:
    return float(re.findall(r'<line class="rule" x1="\d+" y1="([\d.]+)"', svg)[0])


def test_one_huge_rejection_leaves_the_threshold_and_passing_commits_readable() -> None:
    # log E of 1e792 (the axis) at one commit; the others pass with log E near 0.
    huge = 792 * math.log(10)
    evidence = str(case_charts(history(point(1, -0.5), point(2, 0.3), point(3, huge, fail=True), point(4, -1.0)))[0])
    plot_h = BOTTOM_Y - TOP
    threshold_y = rule_y(evidence)
    passing = circles(evidence)
    assert len(passing) == 3
    # The threshold sits well inside the plot (at 1 on an axis that ends at the clip, 3), above the passing commits.
    assert TOP + 0.4 * plot_h < threshold_y < BOTTOM_Y - 0.2 * plot_h
    assert all(threshold_y + 0.15 * plot_h < y <= BOTTOM_Y for y in passing)
    # The huge value is a "far beyond" triangle at the top edge, its exact log E in the tooltip.
    beyond = re.findall(r'<polygon class="beyond" points="[\d., ]+"[^>]*><title>([^<]*)</title>', evidence)
    assert beyond == [f"{3:040x}"[:8] + f": log E = {huge:.4g}, log threshold = {math.log(THRESHOLD):.4g}"]
    assert "beyond the axis" in evidence
    assert evidence.count(">far beyond</text>") == 1
    assert ">rejection threshold<" in evidence
    assert "log E ÷ log threshold" in evidence


def test_a_certain_violation_is_drawn_beyond_the_axis() -> None:
    evidence = str(case_charts(history(point(1, 0.1), point(2, None, fail=True)))[0])
    assert evidence.count('class="beyond"') == 1
    assert "certain violation" in evidence


def test_values_inside_the_clip_are_plain_points() -> None:
    log_t = math.log(THRESHOLD)
    inside = (EVIDENCE_CLIP[1] - 0.5) * log_t
    evidence = str(case_charts(history(point(1, 0.1), point(2, inside, fail=True)))[0])
    assert 'class="beyond"' not in evidence
    assert len(circles(evidence)) == 2


def test_tv_axis_starts_at_zero_and_acceptance_spans_zero_to_hundred_percent() -> None:
    _, tv, acceptance = (str(c) for c in case_charts(history(point(1, 0.1, tv=0.02), point(2, 0.2, tv=0.03, acceptance=0.55))))
    tv_ticks = re.findall(r'text-anchor="end" class="tick">([^<]+)<', tv)
    assert tv_ticks[0] == "0"
    assert "TV distance (0 = exact)" in tv
    # The band's lower edge (tv_low = 0) lies on the plot's bottom edge: the axis starts at exactly 0.
    band = re.findall(r'<polygon class="band" points="([^"]+)"', tv)[0]
    assert max(float(p.split(",")[1]) for p in band.split()) == pytest.approx(BOTTOM_Y, abs=0.1)
    acceptance_ticks = re.findall(r'text-anchor="end" class="tick">([^<]+)<', acceptance)
    assert (acceptance_ticks[0], acceptance_ticks[-1]) == ("0%", "100%")
    assert "drafts accepted (% of γ = 1)" in acceptance


def acceptance_ys(svg: str) -> list[float]:
    return [float(y) for y in re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)" r="2.5" fill="#1f5fbf"', svg)]


def test_acceptance_is_a_share_of_the_drafts_when_the_case_has_several() -> None:
    # The suite reports accepted drafts per trial (0 to γ): 1.5 of γ = 3 is 50 %, drawn halfway up, not at 150 %.
    _, _, acceptance = (str(c) for c in case_charts(history(point(1, 0.1, acceptance=1.5), case_id="direct/x/V64/g3")))
    ticks = re.findall(r'text-anchor="end" class="tick">([^<]+)<', acceptance)
    assert (ticks[0], ticks[-1]) == ("0%", "100%")
    assert "drafts accepted (% of γ = 3)" in acceptance
    [y] = acceptance_ys(acceptance)
    assert y == pytest.approx((TOP + BOTTOM_Y) / 2, abs=0.1)


def test_acceptance_without_a_number_of_drafts_is_the_mean_itself() -> None:
    _, _, acceptance = (str(c) for c in case_charts(history(point(1, 0.1, acceptance=2.4), case_id="e2e/assistant_model/processed")))
    assert "accepted drafts per trial" in acceptance
    assert "%" not in "".join(re.findall(r'text-anchor="end" class="tick">([^<]+)<', acceptance))


def test_consecutive_values_far_beyond_share_one_label_inside_the_plot() -> None:
    huge = 500.0
    evidence = str(case_charts(history(point(1, 0.1), *(point(o, huge, fail=True) for o in (2, 3, 4))))[0])
    assert evidence.count('class="beyond"') == 3
    [label] = re.findall(r'<text class="tick" x="([\d.]+)" y="[\d.]+" text-anchor="(start|end)">far beyond</text>', evidence)
    x, anchor = float(label[0]), label[1]
    # Its text ends inside the plot (the run's first point is near the middle: it reads to the right).
    assert anchor == "start"
    assert x + BEYOND_LABEL_W <= WIDTH - RIGHT


def test_a_rule_and_the_axis_label_are_escaped() -> None:
    svg = render(Chart(title="t", labels=["a", "b"], series=[Series("s", [1.0, 2.0], "#000")], axis=Axis("<y>"), rules=[Rule(1.5, "<r>")]))
    assert "&lt;y&gt;" in svg
    assert "&lt;r&gt;" in svg
    assert "<y>" not in svg
