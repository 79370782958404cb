"""Charts over commits, rendered on the server as inline SVG (no JavaScript, works offline).

A chart is a few series of values over the same commits (x: the commit's position in the series), an
optional shaded band (an interval: the TV estimate's), optional marks (failing commits) and horizontal rules
(a threshold). Its y axis (:class:`Axis`) has a label with the unit, starts where a reader expects (values it
must include, such as 0) and may clip: a value beyond the clip range is drawn at the edge as a triangle
("far beyond"), so one huge value cannot squash the others. Missing values (``None``) break a line; every
point carries its own tooltip. Text is escaped; the output is a complete ``<svg>`` element.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 760, 240
LEFT, RIGHT, TOP, BOTTOM = 72, 16, 28, 52
BEYOND_LABEL_W = 60  # the width of a "far beyond" label at 11 px


def plain(value: float) -> str:
    return f"{value:.3g}"


def percent(value: float) -> str:
    return f"{value:.0%}"


@dataclass(frozen=True)
class Axis:
    """The y axis: its label (with the unit), values it always shows, an optional clip range, tick labels."""

    label: str
    # The axis spans these values whatever the data (0 for a distance, 0 and 1 for a rate); an end set by
    # one of them is not padded, so a TV axis starts at exactly 0.
    include: Sequence[float] = ()
    # Values outside (low, high) are drawn at the nearer edge as "far beyond" triangles.
    clip: tuple[float, float] | None = None
    tick_format: Callable[[float], str] = plain


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float | None]
    color: str
    dashed: bool = False
    # One tooltip per point (the exact value, unclipped); default: the value as the axis writes it.
    tooltips: Sequence[str] | None = None


@dataclass(frozen=True)
class Rule:
    """A horizontal line across the plot (a threshold), labelled at its right end."""

    value: float
    label: str
    color: str = "#d33"


@dataclass(frozen=True)
class Chart:
    title: str
    labels: Sequence[str]  # one per x (short shas)
    series: Sequence[Series]
    axis: Axis = Axis("")
    band: tuple[Sequence[float | None], Sequence[float | None]] | None = None
    marks: Sequence[int] = field(default_factory=tuple)  # x positions to mark (failing commits)
    rules: Sequence[Rule] = ()


def _clipped(value: float | None, clip: tuple[float, float] | None) -> float | None:
    """``value`` inside the clip range (None: missing or NaN)."""
    if value is None or math.isnan(value):
        return None
    if clip is not None:
        return min(max(value, clip[0]), clip[1])
    return value if math.isfinite(value) else None


def _beyond(value: float | None, clip: tuple[float, float] | None) -> bool:
    return clip is not None and value is not None and not math.isnan(value) and not clip[0] <= value <= clip[1]


def _ticks(low: float, high: float) -> list[float]:
    raw = (high - low) / 4
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.ceil(low / step - 1e-9) * step
    return [start + i * step for i in range(int((high - start) / step + 1e-9) + 1)]


def _extent(chart: Chart, values: list[float]) -> tuple[float, float]:
    """The y range: the data and the axis's included values, padded at ends the data set."""
    spanned = values + list(chart.axis.include) + [r.value for r in chart.rules]
    low, high = min(spanned), max(spanned)
    if high - low < 1e-12:
        low, high = low - 0.5, high + 0.5
    pad = (high - low) * 0.06
    fixed = set(chart.axis.include)
    return (low if low in fixed else low - pad), (high if high in fixed else high + pad)


def _empty(title: str) -> str:
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{WIDTH}" height="60" role="img">'
    return f'{svg}{title}<text x="{LEFT}" y="44">no data</text></svg>'


def render(chart: Chart) -> str:
    """The chart as an ``<svg>`` element; an empty chart says so instead of drawing axes."""
    n = len(chart.labels)
    clip = chart.axis.clip
    values = [v for s in chart.series for v in (_clipped(x, clip) for x in s.values) if v is not None]
    if chart.band is not None:
        values += [v for side in chart.band for v in (_clipped(x, clip) for x in side) if v is not None]
    title = f'<text x="{LEFT}" y="18" class="chart-title">{escape(chart.title)}</text>'
    if n == 0 or not values:
        return _empty(title)
    low, high = _extent(chart, values)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    right, bottom = WIDTH - RIGHT, TOP + plot_h

    def x(i: int) -> float:
        return LEFT + (plot_w * (i + 0.5) / n)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - (v - low) / (high - low))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(chart.title)}">',
        title,
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>',
        f'<text class="axis-label" x="14" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {TOP + plot_h / 2:.1f})">{escape(chart.axis.label)}</text>',
        f'<text class="axis-label" x="{LEFT + plot_w / 2:.1f}" y="{bottom + 30}" text-anchor="middle">commit (oldest → newest)</text>',
    ]
    for tick in _ticks(low, high):
        ty = y(tick)
        parts.append(f'<line x1="{LEFT}" y1="{ty:.1f}" x2="{right}" y2="{ty:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{ty + 4:.1f}" text-anchor="end" class="tick">{escape(chart.axis.tick_format(tick))}</text>')
    parts.extend(
        f'<line class="fail-mark" x1="{x(i):.1f}" y1="{TOP}" x2="{x(i):.1f}" y2="{bottom}" stroke="#d33" opacity="0.5"/>'
        for i in chart.marks
    )
    for rule in chart.rules:
        ry = y(rule.value)
        parts.append(
            f'<line class="rule" x1="{LEFT}" y1="{ry:.1f}" x2="{right}" y2="{ry:.1f}" stroke="{rule.color}" stroke-dasharray="5,4"/>'
        )
        parts.append(
            f'<text x="{right - 4}" y="{ry - 4:.1f}" text-anchor="end" class="tick" fill="{rule.color}">{escape(rule.label)}</text>'
        )
    if chart.band is not None:
        parts += _band(chart.band, clip, x, y)
    beyond = False
    for number, series in enumerate(chart.series):
        parts += _series(series, clip, x, y, chart.axis.tick_format, dots=n <= 200)
        beyond |= any(_beyond(v, clip) for v in series.values)
        parts.append(
            f'<text x="{LEFT + 8 + 150 * number}" y="{HEIGHT - 6}" class="legend" fill="{series.color}">{escape(series.name)}</text>'
        )
    if beyond and clip is not None:
        note = f"▲ ▼ beyond the axis (past {chart.axis.tick_format(clip[1])}): value in the tooltip"
        parts.append(f'<text x="{right}" y="{HEIGHT - 6}" text-anchor="end" class="legend">{escape(note)}</text>')
    step = max(1, math.ceil(n / 8))
    parts.extend(
        f'<text x="{x(i):.1f}" y="{bottom + 14}" text-anchor="middle" class="tick">{escape(chart.labels[i])}</text>'
        for i in range(0, n, step)
    )
    parts.append("</svg>")
    return "".join(parts)


def _band(
    band: tuple[Sequence[float | None], Sequence[float | None]],
    clip: tuple[float, float] | None,
    x: Callable[[int], float],
    y: Callable[[float], float],
) -> list[str]:
    pts = [
        (i, lo, hi)
        for i, (a, b) in enumerate(zip(*band, strict=True))
        if (lo := _clipped(a, clip)) is not None and (hi := _clipped(b, clip)) is not None
    ]
    if not pts:
        return []
    upper = " ".join(f"{x(i):.1f},{y(hi):.1f}" for i, _, hi in pts)
    lower = " ".join(f"{x(i):.1f},{y(lo):.1f}" for i, lo, _ in reversed(pts))
    return [f'<polygon class="band" points="{upper} {lower}" fill="#4a7bd0" opacity="0.18"/>']


def _series(
    series: Series,
    clip: tuple[float, float] | None,
    x: Callable[[int], float],
    y: Callable[[float], float],
    tick_format: Callable[[float], str],
    *,
    dots: bool,
) -> list[str]:
    """A series' line (broken at missing values), its dots, and a triangle at each value beyond the clip."""
    segments: list[list[str]] = [[]]
    points: list[str] = []
    previous_beyond = False
    for i, raw in enumerate(series.values):
        v = _clipped(raw, clip)
        if v is None:
            segments.append([])
            previous_beyond = False
            continue
        segments[-1].append(f"{x(i):.1f},{y(v):.1f}")
        assert raw is not None  # _clipped keeps no missing value
        tip = escape(series.tooltips[i] if series.tooltips is not None else f"{series.name}: {tick_format(raw)}")
        if _beyond(raw, clip):
            cx, cy, tip_dy = x(i), y(v), (-7 if raw > v else 7)
            points.append(
                f'<polygon class="beyond" points="{cx - 5:.1f},{cy:.1f} {cx + 5:.1f},{cy:.1f} {cx:.1f},{cy + tip_dy:.1f}" '
                f'fill="{series.color}"><title>{tip}</title></polygon>'
            )
            if not previous_beyond:  # one label per run of such points, inside the plot: labels never overlap
                anchor, tx = ("end", cx - 8) if cx + 8 + BEYOND_LABEL_W > WIDTH - RIGHT else ("start", cx + 8)
                ty = cy + (16 if raw > v else -8)  # inside the plot, off the edge where the line runs
                points.append(f'<text class="tick" x="{tx:.1f}" y="{ty:.1f}" text-anchor="{anchor}">far beyond</text>')
        elif dots:
            points.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="2.5" fill="{series.color}"><title>{tip}</title></circle>')
        previous_beyond = _beyond(raw, clip)
    d = " ".join("M" + " L".join(seg) for seg in segments if seg)
    dash = ' stroke-dasharray="5,4"' if series.dashed else ""
    return [f'<path class="series" d="{d}" fill="none" stroke="{series.color}" stroke-width="1.8"{dash}/>', *points]
