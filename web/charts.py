"""
Charts the console draws on the server: small SVGs with a text alternative (a title and an
accessible name carrying the figures), so a page needs no chart library and no script, and a
screen reader hears what a sighted reader sees.
"""

from __future__ import annotations

import math

from django.utils.html import format_html
from django.utils.safestring import SafeString

WIDTH, HEIGHT, PAD = 160, 32, 2


def sparkline(values: list[float | None], *, top: float, label: str, unit: str = "") -> SafeString:
    """
    A line of ``values`` (oldest first; None for a gap) on a fixed scale 0..``top``, named
    "<label>: min, mean and max <unit>". An empty series is a dash, said as "no data yet".
    """
    seen = [v for v in values if v is not None]
    if not seen:
        return format_html('<span class="muted" title="{}: no data yet">–</span>', label)
    summary = f"{label}: min {min(seen):.0f}{unit}, mean {sum(seen) / len(seen):.0f}{unit}, max {max(seen):.0f}{unit}"
    step = (WIDTH - 2 * PAD) / max(1, len(values) - 1)
    runs, run = [], []
    for i, value in enumerate(values):
        if value is None:  # a gap in the samples is a gap in the line, not a fall to zero
            runs, run = runs + [run] if run else runs, []
            continue
        y = HEIGHT - PAD - (min(max(value, 0.0), top) / top) * (HEIGHT - 2 * PAD) if top else HEIGHT - PAD
        run.append(f"{PAD + i * step:.1f},{y:.1f}")
    if run:
        runs.append(run)
    lines = SafeString("".join(
        format_html('<polyline points="{}" fill="none" stroke="currentColor" stroke-width="1.5"/>', " ".join(r))
        for r in runs))
    return format_html(
        '<svg class="sparkline" role="img" aria-label="{}" viewBox="0 0 {} {}" width="{}" height="{}">'
        '<title>{}</title>{}</svg>', summary, WIDTH, HEIGHT, WIDTH, HEIGHT, summary, lines)


def round_up(value: float) -> float:
    """The smallest 1, 2 or 5 x 10^n at or above ``value`` (1 for nothing): an axis's top a reader can read."""
    if value <= 0:
        return 1.0
    scale = 10 ** math.floor(math.log10(value))
    return next(step * scale for step in (1, 2, 5, 10) if step * scale >= value)


def time_labels(times: list) -> list[str]:
    """Four evenly spaced HH:MM labels under a chart of ``times`` (the rest blank)."""
    marks = {round(i * (len(times) - 1) / 3) for i in range(4)}
    return [f"{t:%H:%M}" if i in marks else "" for i, t in enumerate(times)]


PALETTE = ["#1d4ed8", "#d97706", "#059669", "#9333ea", "#dc2626", "#0891b2", "#4b5563"]


def line_chart(series: dict[str, list[float | None]], *, x_labels: list[str], x_total: int, top: float,
               projection: dict[str, float] | None = None, label: str, unit_prefix: str = "",
               width: int = 560, height: int = 180, left: int = 52) -> SafeString:
    """
    Lines of ``series`` (one per name, a point per x from the first; None for a gap) across
    ``x_total`` slots on a y-axis from 0 to ``top`` (three round ticks), with an optional dashed
    projection of each line to the last slot; its accessible name lists each line's last value
    (and projection).
    """
    plot_w, plot_h, bottom = width - left - 8, height - 34, height - 22
    step = plot_w / max(1, x_total - 1)

    def x(i):
        return left + i * step

    def y(v):
        return bottom - (min(max(v, 0.0), top) / top) * plot_h if top else bottom

    parts = []
    for value in (0, top / 2, top):
        parts.append(format_html('<line class="{}" x1="{}" y1="{}" x2="{}" y2="{}"/>'
                                 '<text x="{}" y="{}" text-anchor="end">{}{}</text>',
                                 "axis" if value == 0 else "grid", left, f"{y(value):.1f}", width - 8,
                                 f"{y(value):.1f}", left - 6, f"{y(value) + 4:.1f}", unit_prefix, f"{value:,.0f}"))
    for i, text in enumerate(x_labels):
        if text:
            parts.append(format_html('<text x="{}" y="{}" text-anchor="middle">{}</text>', f"{x(i):.1f}", height - 6,
                                     text))
    said = []
    for n, (name, values) in enumerate(series.items()):
        colour = PALETTE[n % len(PALETTE)]
        for run in _runs(values):
            if len(run) == 1:  # a lone sample is a dot: a line needs two
                (i, v), = run
                parts.append(format_html('<circle cx="{}" cy="{}" r="2.5" fill="{}"/>', f"{x(i):.1f}",
                                         f"{y(v):.1f}", colour))
                continue
            points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in run)
            parts.append(format_html('<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>', points,
                                     colour))
        seen = [v for v in values if v is not None]
        words = f"{name} {unit_prefix}{seen[-1]:,.2f}" if seen else f"{name} no data"
        if projection and name in projection and values and values[-1] is not None:
            end = projection[name]
            parts.append(format_html('<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" '
                                     'stroke-width="1.5" stroke-dasharray="4 3"/>', f"{x(len(values) - 1):.1f}",
                                     f"{y(values[-1]):.1f}", f"{x(x_total - 1):.1f}", f"{y(end):.1f}", colour))
            words += f" (about {unit_prefix}{end:,.0f} at the end)"
        said.append(words)
    summary = f"{label}: " + "; ".join(said)
    return format_html('<svg class="chart" role="img" aria-label="{}" viewBox="0 0 {} {}"><title>{}</title>{}</svg>',
                       summary, width, height, summary, SafeString("".join(parts)))


def _runs(values: list[float | None]) -> list[list[tuple[int, float]]]:
    """The stretches of ``values`` between gaps, as (index, value) pairs."""
    runs, run = [], []
    for i, value in enumerate(values):
        if value is None:
            if run:
                runs.append(run)
            run = []
        else:
            run.append((i, value))
    if run:
        runs.append(run)
    return runs
