"""Small inline SVG charts: lines over time and horizontal bars. Written here, not by a
library: a chart is a few dozen lines of markup, and the page must load nothing."""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from dataclasses import dataclass

W, H = 360, 120
PAD_L, PAD_R, PAD_T, PAD_B = 44, 8, 8, 20


@dataclass(frozen=True, kw_only=True)
class Series:
    label: str
    css: str  # the class that colours it (the page's style sheet)
    points: Sequence[tuple[float, float]]  # (epoch seconds, value)


def _num(value: float, percent: bool) -> str:
    if percent:
        return f"{value:.0%}"
    return f"{value:.3g}"


def _day(epoch: float) -> str:
    return time.strftime("%m-%d", time.gmtime(epoch))


def lines(series: Sequence[Series], *, title: str, percent: bool = False, zero: bool = True) -> str:
    """A line chart; an empty one says there is nothing to draw."""
    pts = [p for s in series for p in s.points]
    esc = html.escape(title)
    if not pts:
        return f'<p class="empty">{esc}: nothing recorded yet</p>'
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0 = 0.0 if zero else min(ys)
    y1 = max(ys) if max(ys) > y0 else y0 + 1.0
    span = x1 - x0 or 1.0

    def x(t: float) -> float:
        return PAD_L + (t - x0) / span * (W - PAD_L - PAD_R) if x1 > x0 else (PAD_L + W - PAD_R) / 2

    def y(v: float) -> float:
        return PAD_T + (1 - (v - y0) / (y1 - y0)) * (H - PAD_T - PAD_B)

    out = [f'<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
           f'aria-label="{esc}"><title>{esc}</title>',
           f'<line class="axis" x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}"/>',
           f'<text class="tick" x="{PAD_L - 4}" y="{y(y1) + 4:.1f}" text-anchor="end">'
           f"{_num(y1, percent)}</text>",
           f'<text class="tick" x="{PAD_L - 4}" y="{y(y0):.1f}" text-anchor="end">{_num(y0, percent)}</text>',
           f'<text class="tick" x="{PAD_L}" y="{H - 4}">{_day(x0)}</text>',
           f'<text class="tick" x="{W - PAD_R}" y="{H - 4}" text-anchor="end">{_day(x1)}</text>']
    for s in series:
        if not s.points:
            continue
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in s.points)
        out.append(f'<polyline class="{html.escape(s.css)}" points="{path}"><title>'
                   f'{html.escape(s.label)}</title></polyline>')
        last_t, last_v = s.points[-1]
        out.append(f'<circle class="{html.escape(s.css)}" cx="{x(last_t):.1f}" cy="{y(last_v):.1f}" r="2.5">'
                   f'<title>{html.escape(s.label)}: {_num(last_v, percent)}</title></circle>')
    out.append("</svg>")
    legend = " ".join(f'<span class="key {html.escape(s.css)}">{html.escape(s.label)}</span>' for s in series)
    return f'<figure><figcaption>{esc} {legend}</figcaption>{"".join(out)}</figure>'


def bar(fraction: float, *, label: str) -> str:
    """A 0..1 fraction as a short horizontal bar with its percentage."""
    f = max(0.0, min(1.0, fraction))
    return (f'<svg class="bar" viewBox="0 0 100 10" width="100" height="10" role="img" '
            f'aria-label="{html.escape(label)}"><rect class="track" width="100" height="10"/>'
            f'<rect class="fill" width="{f * 100:.1f}" height="10"/></svg> {f:.0%}')
