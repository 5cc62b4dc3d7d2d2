"""
Charts the console draws on the server: small SVGs with a text alternative (a title and an
accessible name carrying the figures), so a page needs no chart library and no script, and a
screen reader hears what a sighted reader sees.
"""

from __future__ import annotations

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
