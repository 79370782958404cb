"""Charts over commits, rendered on the server as inline SVG (no JavaScript, works offline).

A chart is a few series of values over the same commits (x: the commit's position in the series), an
optional shaded band (an interval: the TV estimate's), and optional marks (failing commits). Missing values
(``None``) break a line. Text is escaped; the output is a complete ``<svg>`` element.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 760, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 36


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float | None]
    color: str
    dashed: bool = False


@dataclass(frozen=True)
class Chart:
    title: str
    labels: Sequence[str]  # one per x (short shas)
    series: Sequence[Series]
    band: tuple[Sequence[float | None], Sequence[float | None]] | None = None
    marks: Sequence[int] = field(default_factory=tuple)  # x positions to mark (failing commits)
    # Ticks labelled 10^k: the values are log10 of the quantity.
    log_ticks: bool = False


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _ticks(low: float, high: float, log_ticks: bool) -> list[float]:
    if log_ticks:
        first, last = math.floor(low), math.ceil(high)
        step = max(1, math.ceil((last - first) / 5))
        return [float(k) for k in range(first, last + 1, step)]
    span = high - low
    raw = span / 4
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.floor(low / step) * step
    return [start + i * step for i in range(int((high - start) / step) + 2) if start + i * step <= high + 1e-12]


def _tick_label(value: float, log_ticks: bool) -> str:
    if log_ticks:
        return f"1e{int(value)}"
    return f"{value:.3g}"


def _grid(chart: Chart, low: float, high: float, y: Callable[[float], float]) -> list[str]:
    parts = []
    right = WIDTH - RIGHT
    for tick in _ticks(low, high, chart.log_ticks):
        if low <= tick <= high:
            ty = y(tick)
            label = _tick_label(tick, chart.log_ticks)
            parts.append(f'<line x1="{LEFT}" y1="{ty:.1f}" x2="{right}" y2="{ty:.1f}" stroke="#eee"/>')
            parts.append(f'<text x="{LEFT - 6}" y="{ty + 4:.1f}" text-anchor="end" class="tick">{label}</text>')
    return parts


def render(chart: Chart) -> str:
    """The chart as an ``<svg>`` element; an empty chart says so instead of drawing axes."""
    n = len(chart.labels)
    values = [v for s in chart.series for v in _finite(s.values)]
    if chart.band is not None:
        values += _finite(chart.band[0]) + _finite(chart.band[1])
    title = f'<text x="{LEFT}" y="18" class="chart-title">{escape(chart.title)}</text>'
    if n == 0 or not values:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{WIDTH}" height="60" role="img">'
            f'{title}<text x="{LEFT}" y="44">no data</text></svg>'
        )
    low, high = min(values), max(values)
    if high - low < 1e-12:
        low, high = low - 0.5, high + 0.5
    pad = (high - low) * 0.05
    low, high = low - pad, high + pad
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + (plot_w * (i + 0.5) / n)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - (v - low) / (high - low))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(chart.title)}">',
        title,
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>',
    ]
    parts += _grid(chart, low, high, y)
    parts.extend(
        f'<line class="fail-mark" x1="{x(i):.1f}" y1="{TOP}" x2="{x(i):.1f}" y2="{TOP + plot_h}" stroke="#d33" opacity="0.5"/>'
        for i in chart.marks
    )
    if chart.band is not None:
        lows, highs = chart.band
        pts = [(i, lo, hi) for i, (lo, hi) in enumerate(zip(lows, highs, strict=True)) if lo is not None and hi is not None]
        if pts:
            upper = " ".join(f"{x(i):.1f},{y(hi):.1f}" for i, _, hi in pts)
            lower = " ".join(f"{x(i):.1f},{y(lo):.1f}" for i, lo, _ in reversed(pts))
            parts.append(f'<polygon class="band" points="{upper} {lower}" fill="#4a7bd0" opacity="0.18"/>')
    for number, series in enumerate(chart.series):
        segments: list[list[str]] = [[]]
        for i, v in enumerate(series.values):
            if v is None or not math.isfinite(v):
                segments.append([])
            else:
                segments[-1].append(f"{x(i):.1f},{y(v):.1f}")
        d = " ".join("M" + " L".join(seg) for seg in segments if seg)
        dash = ' stroke-dasharray="5,4"' if series.dashed else ""
        parts.append(f'<path class="series" d="{d}" fill="none" stroke="{series.color}" stroke-width="1.8"{dash}/>')
        if n <= 200:
            parts.extend(
                f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="2.5" fill="{series.color}"/>'
                for i, v in enumerate(series.values)
                if v is not None and math.isfinite(v)
            )
        parts.append(
            f'<text x="{LEFT + 8 + 150 * number}" y="{HEIGHT - 8}" class="legend" fill="{series.color}">{escape(series.name)}</text>'
        )
    step = max(1, math.ceil(n / 8))
    parts.extend(
        f'<text x="{x(i):.1f}" y="{TOP + plot_h + 14}" text-anchor="middle" class="tick">{escape(chart.labels[i])}</text>'
        for i in range(0, n, step)
    )
    parts.append("</svg>")
    return "".join(parts)
