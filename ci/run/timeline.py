"""The timeline of a GPU run: which entry held which GPU when, who waited, what sat idle.

Pure builders: `build()` turns results into a `Timeline`; `html()` renders it as one
self-contained page (inline SVG and CSS, nothing fetched, so it opens from a CI
artifact or an air-gapped box); `mermaid()` renders a `gantt` chart for the step summary.
`TimelinePage` observes a run (`ci.history.run_observer`) and, when entries took GPUs,
writes the page into the run's directory as the run ends.
"""

from __future__ import annotations

import html as _html
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from ci.history.run_observer import Hints, RunEnd, RunObserver, RunStart
from ci.results import gpu_row

if TYPE_CHECKING:
    from ci.results import Result


# Colours by outcome (GitHub's palette, so the page reads like the checks it sits next to).
COLOURS: dict[str, str] = {
    "passed": "#2da44e",
    "flaky": "#d4a72c",
    "failed": "#cf222e",
    "timeout": "#8250df",
    "empty": "#bf3989",
    "lost": "#fb8500",
    "interrupted": "#6e7781",
    "deselected": "#afb8c1",
}
# Mermaid has four task tags; failures are `crit` (red), retried passes `active`.
MERMAID_TAGS: dict[str, str] = {"passed": "done", "deselected": "done", "flaky": "active"}
MIN_GAP = 0.05  # seconds: shorter idle gaps and waits are scheduling noise

LABEL_W = 230
CHART_W = 1100
ROW_H = 22
AXIS_H = 28


@dataclass(frozen=True, kw_only=True)
class Bar:
    """One attempt of one entry on one row (a GPU, or a CPU lane for 0-GPU entries)."""

    entry: str
    row: str
    start: float  # epoch seconds
    end: float
    outcome: str
    attempt: int
    waited: float  # seconds it waited for its GPUs before starting
    rows: tuple[str, ...]  # every row this attempt held (a 4-GPU entry: four)


@dataclass(frozen=True, kw_only=True)
class Wait:
    """Time an attempt spent queued for its GPUs."""

    entry: str
    start: float
    end: float
    attempt: int
    lane: int  # waits are packed into as few lanes as overlap allows


@dataclass(frozen=True, kw_only=True)
class Gap:
    """An idle stretch of one GPU row within the run."""

    row: str
    start: float
    end: float


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """Everything the renderers draw; times are epoch seconds."""

    title: str
    origin: float
    end: float
    rows: tuple[str, ...]  # GPU rows first (node:gpu), then CPU lanes (node:cpu…)
    bars: tuple[Bar, ...]
    waits: tuple[Wait, ...]
    gaps: tuple[Gap, ...]

    @property
    def span(self) -> float:
        return max(self.end - self.origin, 1e-6)

    def busy(self, row: str) -> float:
        """Seconds the row was held (overlaps on a CPU lane counted once)."""
        return sum(end - start for start, end in _union(
            (b.start, b.end) for b in self.bars if b.row == row))


def _attempts(result: Result) -> list[Result]:
    return [*result.earlier, result]


def _union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _pack(spans: Sequence[tuple[float, float]]) -> list[int]:
    """Lane per span such that spans in one lane never overlap (greedy, by start)."""
    lanes: list[float] = []  # end of the last span in each lane
    out = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda k: spans[k]):
        start, end = spans[i]
        for lane, last in enumerate(lanes):
            if last <= start:
                lanes[lane] = end
                out[i] = lane
                break
        else:
            lanes.append(end)
            out[i] = len(lanes) - 1
    return out


def _sort_key(row: str) -> tuple[str, int, int, str]:
    node, _, rest = row.rpartition(":")
    if rest.isdigit():
        return (node, 0, int(rest), "")
    return (node, 1, 0, rest)


def build(results: Sequence[Result], *, title: str, gpu_rows: Sequence[str] = ()) -> Timeline:
    """The timeline of a run. `gpu_rows`: every GPU the run could use, so unused ones show too."""
    bars: list[Bar] = []
    waiting: list[tuple[str, float, float, int]] = []
    cpu: list[tuple[Result, int]] = []
    for result in results:
        for number, attempt in enumerate(_attempts(result), start=1):
            start = attempt.started_at
            end = attempt.ended_at
            waited_until = start if start is not None else end
            if (attempt.queued_at is not None and waited_until is not None
                    and waited_until - attempt.queued_at >= MIN_GAP):
                waiting.append((result.entry.id, attempt.queued_at, waited_until, number))
            if start is None or end is None or (attempt.outcome == "interrupted" and end <= start):
                continue
            waited = start - attempt.queued_at if attempt.queued_at is not None else 0.0
            if attempt.devices:
                rows = tuple(gpu_row(attempt.node, d) for d in attempt.devices)
                bars.extend(Bar(entry=result.entry.id, row=row, start=start, end=end,
                                outcome=attempt.outcome, attempt=number, waited=waited, rows=rows)
                            for row in rows)
            else:
                cpu.append((attempt, number))
    # 0-GPU entries (config checks in a GPU suite) share CPU lanes per node, packed.
    for node in sorted({a.node for a, _ in cpu}):
        mine = [(a, n) for a, n in cpu if a.node == node]
        spans = [(a.started_at or 0.0, a.ended_at or 0.0) for a, _ in mine]
        for (attempt, number), (start, end), lane in zip(mine, spans, _pack(spans), strict=True):
            row = f"{node}:cpu{lane + 1}"
            bars.append(Bar(entry=attempt.entry.id, row=row, start=start, end=end,
                            outcome=attempt.outcome, attempt=number, waited=0.0, rows=(row,)))
    waits = tuple(Wait(entry=e, start=s, end=t, attempt=n, lane=lane)
                  for (e, s, t, n), lane in zip(waiting, _pack([(s, t) for _, s, t, _ in waiting]),
                                                strict=True))
    times = [b.start for b in bars] + [w.start for w in waits]
    ends = [b.end for b in bars] + [w.end for w in waits]
    origin = min(times, default=0.0)
    end = max(ends, default=origin)
    ordered = sorted({*gpu_rows, *(b.row for b in bars)}, key=_sort_key)
    gaps: list[Gap] = []
    for row in ordered:
        if not row.rpartition(":")[2].isdigit():
            continue  # a CPU lane exists only while something runs on it
        cursor = origin
        for start, stop in _union((b.start, b.end) for b in bars if b.row == row):
            if start - cursor >= MIN_GAP:
                gaps.append(Gap(row=row, start=cursor, end=start))
            cursor = max(cursor, stop)
        if end - cursor >= MIN_GAP:
            gaps.append(Gap(row=row, start=cursor, end=end))
    return Timeline(title=title, origin=origin, end=end, rows=tuple(ordered), bars=tuple(bars),
                    waits=waits, gaps=tuple(gaps))


# --- HTML ---------------------------------------------------------------------------------


def _esc(text: str) -> str:
    return _html.escape(text, quote=True)


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 10)}"


def _tick_step(span: float) -> float:
    """A round tick interval giving about 10 ticks."""
    raw = span / 10
    base = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def _short(entry: str) -> str:
    path, _, args = entry.partition(" ")
    name = PurePosixPath(path).name
    return f"{name} {args}".strip()


def _inside(label: str, x: float, width: float, y: int, cls: str) -> str:
    """The entry's name inside its bar, cut to fit; nothing when the bar is too narrow."""
    room = int((width - 6) / 6.2)  # about 6.2 px per character at 11 px
    if room < 4:
        return ""
    shown = label if len(label) <= room else label[:room - 1] + "…"
    return f'<text x="{x + 3:.2f}" y="{y + 15}" class="{cls}">{_esc(shown)}</text>'


def html(tl: Timeline) -> str:
    """One self-contained HTML page: a row per GPU, a bar per entry, waits and idle gaps."""
    scale = CHART_W / tl.span

    def x(t: float) -> float:
        return LABEL_W + (t - tl.origin) * scale

    lanes = max((w.lane for w in tl.waits), default=-1) + 1
    height = AXIS_H + ROW_H * (len(tl.rows) + lanes + (1 if lanes else 0)) + 10
    width = LABEL_W + CHART_W + 20
    out: list[str] = []
    out.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
               f'viewBox="0 0 {width} {height}" role="img" aria-label="{_esc(tl.title)}">')
    out.append('<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
               'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f6f8fa"/>'
               '<line x1="0" y1="0" x2="0" y2="6" stroke="#8c959f" stroke-width="2"/></pattern>'
               '<pattern id="idle" width="4" height="4" patternUnits="userSpaceOnUse">'
               '<circle cx="2" cy="2" r="0.8" fill="#d0d7de"/></pattern></defs>')
    step = _tick_step(tl.span)
    ticks = int(tl.span / step) + 1
    out.append('<g class="axis">')
    for i in range(ticks):
        tx = x(tl.origin + i * step)
        out.append(f'<line x1="{tx:.1f}" y1="{AXIS_H - 6}" x2="{tx:.1f}" y2="{height - 10}" '
                   'stroke="#eaeef2"/>')
        out.append(f'<text x="{tx:.1f}" y="{AXIS_H - 10}" class="tick">+{i * step:g}s</text>')
    out.append("</g>")
    for n, row in enumerate(tl.rows):
        y = AXIS_H + n * ROW_H
        busy = tl.busy(row)
        is_gpu = row.rpartition(":")[2].isdigit()
        idle = tl.span - busy
        note = f"idle {idle:.1f}s ({idle / tl.span:.0%})" if is_gpu else "0-GPU entries"
        out.append(f'<g class="row" data-row="{_esc(row)}" data-busy="{busy:.3f}">')
        out.append(f'<text x="6" y="{y + 15}" class="label">{_esc(row)}</text>')
        out.append(f'<text x="{LABEL_W - 6}" y="{y + 15}" class="note" text-anchor="end">{note}</text>')
        out.append(f'<rect class="lane" x="{LABEL_W}" y="{y + 2}" width="{CHART_W}" '
                   f'height="{ROW_H - 4}" fill="url(#idle)"/>')
        for gap in (g for g in tl.gaps if g.row == row):
            out.append(f'<rect class="gap" data-start="{gap.start - tl.origin:.3f}" '
                       f'data-end="{gap.end - tl.origin:.3f}" x="{x(gap.start):.2f}" y="{y + 2}" '
                       f'width="{(gap.end - gap.start) * scale:.2f}" height="{ROW_H - 4}" '
                       f'fill="transparent"><title>{_esc(row)} idle {gap.end - gap.start:.1f}s '
                       f'(+{gap.start - tl.origin:.1f}s to +{gap.end - tl.origin:.1f}s)</title></rect>')
        for bar in (b for b in tl.bars if b.row == row):
            bx, bw = x(bar.start), max((bar.end - bar.start) * scale, 1.0)
            colour = COLOURS.get(bar.outcome, "#57606a")
            tip = (f"{bar.entry}\nattempt {bar.attempt}: {bar.outcome}\n"
                   f"ran +{bar.start - tl.origin:.1f}s to +{bar.end - tl.origin:.1f}s "
                   f"({bar.end - bar.start:.1f}s, {_clock(bar.start)} to {_clock(bar.end)} UTC)\n"
                   f"waited {bar.waited:.1f}s for GPUs\non {', '.join(bar.rows)}")
            out.append(f'<rect class="bar" data-entry="{_esc(bar.entry)}" data-outcome="{bar.outcome}" '
                       f'data-attempt="{bar.attempt}" data-start="{bar.start - tl.origin:.3f}" '
                       f'data-end="{bar.end - tl.origin:.3f}" x="{bx:.2f}" y="{y + 3}" width="{bw:.2f}" '
                       f'height="{ROW_H - 6}" rx="2" fill="{colour}" stroke="#ffffff" stroke-width="0.5">'
                       f"<title>{_esc(tip)}</title></rect>")
            out.append(_inside(_short(bar.entry), bx, bw, y, "in"))
        out.append("</g>")
    if lanes:
        y0 = AXIS_H + len(tl.rows) * ROW_H
        out.append(f'<text x="6" y="{y0 + 15}" class="label">waiting for GPUs</text>')
        for wait in tl.waits:
            y = y0 + (wait.lane + 1) * ROW_H
            tip = (f"{wait.entry}\nattempt {wait.attempt}: waited {wait.end - wait.start:.1f}s for GPUs\n"
                   f"+{wait.start - tl.origin:.1f}s to +{wait.end - tl.origin:.1f}s")
            out.append(f'<rect class="wait" data-entry="{_esc(wait.entry)}" data-attempt="{wait.attempt}" '
                       f'data-start="{wait.start - tl.origin:.3f}" data-end="{wait.end - tl.origin:.3f}" '
                       f'x="{x(wait.start):.2f}" y="{y + 3}" '
                       f'width="{max((wait.end - wait.start) * scale, 1.0):.2f}" height="{ROW_H - 6}" '
                       f'fill="url(#hatch)" stroke="#8c959f" stroke-width="0.5">'
                       f"<title>{_esc(tip)}</title></rect>")
            out.append(_inside(_short(wait.entry), x(wait.start), (wait.end - wait.start) * scale, y, "wl"))
    out.append("</svg>")
    outcomes = sorted({b.outcome for b in tl.bars}, key=list(COLOURS).index) if tl.bars else []
    legend = "".join(f'<span class="key"><i style="background:{COLOURS[o]}"></i>{o}</span>'
                     for o in outcomes if o in COLOURS)
    legend += ('<span class="key"><i class="hatch"></i>waiting for GPUs</span>'
               '<span class="key"><i class="dots"></i>idle</span>')
    gpu_rows = [r for r in tl.rows if r.rpartition(":")[2].isdigit()]
    busy = sum(tl.busy(r) for r in gpu_rows)
    used = f"{busy / (tl.span * len(gpu_rows)):.0%}" if gpu_rows else "n/a"
    head = (f"{len({b.entry for b in tl.bars})} entries on {len(gpu_rows)} GPUs, "
            f"{tl.span:.1f}s from {_clock(tl.origin)} UTC; GPUs busy {used} of the time; "
            f"longest wait {max((w.end - w.start for w in tl.waits), default=0.0):.1f}s")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(tl.title)}</title>
<style>
body {{ font: 13px -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2328; margin: 16px; }}
h1 {{ font-size: 18px; margin: 0 0 4px; }}
p.sum {{ margin: 0 0 8px; color: #57606a; }}
.key {{ margin-right: 14px; white-space: nowrap; }}
.key i {{ display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -2px;
  border: 1px solid #8c959f; }}
.key i.hatch {{ background: repeating-linear-gradient(45deg, #8c959f 0 2px, #f6f8fa 2px 5px); }}
.key i.dots {{ background: radial-gradient(#d0d7de 30%, #ffffff 31%) 0 0 / 4px 4px; }}
svg text {{ font-size: 11px; fill: #1f2328; }}
svg text.tick, svg text.note {{ fill: #57606a; font-size: 10px; }}
svg text.in {{ fill: #ffffff; pointer-events: none; }}
svg text.wl {{ fill: #1f2328; pointer-events: none; }}
svg rect.bar:hover, svg rect.wait:hover {{ stroke: #1f2328; stroke-width: 1.5; }}
</style></head>
<body>
<h1>{_esc(tl.title)}</h1>
<p class="sum">{_esc(head)}</p>
<p class="legend">{legend}</p>
{"".join(out)}
</body></html>
"""


# --- Mermaid ------------------------------------------------------------------------------


def _mermaid_text(text: str) -> str:
    # The gantt lexer ends a task name at ':', '#' or ';'; keep names to a safe alphabet.
    return re.sub(r"[^A-Za-z0-9_./=,+@()\[\] -]+", "-", text).strip() or "entry"


def mermaid(tl: Timeline) -> str:
    """A Mermaid `gantt` chart: a section per GPU, waits in their own section (compact rows)."""

    def ms(t: float) -> str:
        return str(round(t * 1000))

    lines = ["---", "displayMode: compact", "---", "gantt",
             f"    title {_mermaid_text(tl.title)}", "    dateFormat x", "    axisFormat %H:%M:%S"]
    for row in tl.rows:
        bars = sorted((b for b in tl.bars if b.row == row), key=lambda b: b.start)
        if not bars:
            continue
        node, _, device = row.rpartition(":")
        label = f"{node} gpu {device}" if device.isdigit() else f"{node} {device}"
        lines.append(f"    section {_mermaid_text(label)}")
        for bar in bars:
            tag = MERMAID_TAGS.get(bar.outcome, "crit")
            name = _mermaid_text(f"{_short(bar.entry)} {bar.outcome}")
            # A zero-length task is drawn as nothing; keep one millisecond.
            end = max(bar.end, bar.start + 0.001)
            lines.append(f"    {name} :{tag}, {ms(bar.start)}, {ms(end)}")
    if tl.waits:
        lines.append("    section waiting for GPUs")
        for wait in sorted(tl.waits, key=lambda w: w.start):
            end = max(wait.end, wait.start + 0.001)
            lines.append(f"    {_mermaid_text(_short(wait.entry))} waits :{ms(wait.start)}, {ms(end)}")
    return "\n".join(lines) + "\n"


def summary_markdown(tl: Timeline, path: str) -> str:
    """The step-summary block: the chart and where the full page is."""
    return f"#### GPU timeline\n\n```mermaid\n{mermaid(tl)}```\n\nFull timeline: `{path}`\n"


class TimelinePage(RunObserver):
    """A GPU run's timeline: the page in its directory, a chart in the step summary, and
    one line saying where the page is."""

    def __init__(self) -> None:
        self._start: RunStart | None = None

    def begin(self, start: RunStart) -> Hints:
        self._start = start
        return Hints()

    def run_ended(self, end: RunEnd) -> None:
        if not end.gpu_run:
            return
        if self._start is None:
            raise RuntimeError("the timeline is told the suite as the run begins; begin() was not called")
        log = self._start.log
        tl = build(end.judgement.results, title=f"{self._start.suite.name}: GPU timeline",
                   gpu_rows=end.gpu_rows)
        end.work_dir.mkdir(parents=True, exist_ok=True)
        page = end.work_dir / "timeline.html"
        page.write_text(html(tl), encoding="utf-8")
        log.summary(summary_markdown(tl, str(page)))
        log.line(f"timeline: {page}")
