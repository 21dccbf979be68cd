"""`python -m ci coverage`: every test file, who runs it and how it fared, on one page.

Writes a self-contained HTML page (inline CSS and SVG, nothing fetched) and a Markdown
table for the step summary. Files no suite runs and suites no run has recorded stand out.
"""

from __future__ import annotations

import argparse
import html
import os
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ci.errors import EXIT_OK, StoreError, UsageError
from ci.history.stats import ESTIMATE_PERCENTILE, OK, flakiness, percentile
from ci.history.store import AttemptRow, open_store, resolve_url
from ci.log import Log
from ci.registry.loader import Registry, load_registry
from ci.registry.model import Suite
from ci.select.discover import TestFile, discover
from ci.select.entries import suite_entries

TREND = 12  # outcomes in the small trend strip
OUT_DIR = ".ci-cache/coverage"


@dataclass(frozen=True, kw_only=True)
class Row:
    """One test file on the page."""

    path: str
    suites: tuple[str, ...]
    labels: tuple[str, ...]
    num_gpus: str
    hardware: str
    last_outcome: str
    pass_rate: float | None
    flake_rate: float | None
    p90: float | None
    last_run: float | None
    trend: tuple[str, ...]  # oldest first

    @property
    def unrun(self) -> bool:
        return not self.suites


def _runs_of(registry: Registry, files: Mapping[str, TestFile]) -> dict[str, list[Suite]]:
    out: dict[str, list[Suite]] = defaultdict(list)
    for suite in registry:
        if suite.dynamic:
            continue
        for entry in suite_entries(suite, files):
            if suite not in out[entry.path]:
                out[entry.path].append(suite)
    return out


def build_rows(registry: Registry, files: Mapping[str, TestFile], rows: Sequence[AttemptRow]) -> list[Row]:
    """The page's rows: every discovered test file, what runs it, its history (pure)."""
    runs_of = _runs_of(registry, files)
    by_path: dict[str, list[AttemptRow]] = defaultdict(list)
    for r in rows:
        if r.final and r.event != "import" and r.outcome not in ("interrupted", "deselected"):
            by_path[r.path].append(r)
    flakes_by_entry = flakiness(rows)
    out = []
    for path, tf in sorted(files.items()):
        suites = runs_of.get(path, [])
        hist = by_path.get(path, [])
        entry_ids = {r.entry_id for r in hist}
        flake = [flakes_by_entry[e] for e in entry_ids if e in flakes_by_entry]
        runs = sum(f.runs for f in flake)
        passing = [r.seconds for r in hist if r.outcome in ("passed", "flaky")]
        out.append(Row(
            path=path, suites=tuple(s.name for s in suites),
            labels=tuple(sorted({s.label for s in suites if s.label})),
            num_gpus="?" if tf.num_gpus is None else str(tf.num_gpus),
            hardware=", ".join(sorted({r.hardware for r in hist})) or
                     ("GPU" if any(s.needs_gpus for s in suites) else "CPU" if suites else "-"),
            last_outcome=hist[-1].outcome if hist else "",
            pass_rate=sum(r.outcome in OK for r in hist) / len(hist) if hist else None,
            flake_rate=sum(f.flakes for f in flake) / runs if runs else None,
            p90=percentile(passing[-15:], ESTIMATE_PERCENTILE) if passing else None,
            last_run=hist[-1].started_at if hist else None,
            trend=tuple(r.outcome for r in hist[-TREND:])))
    # What needs a person first: files no suite runs, then files whose last run failed.
    return sorted(out, key=lambda r: (not r.unrun, not (r.last_outcome and r.last_outcome not in OK),
                                      r.path))


def unrecorded_suites(registry: Registry, rows: Sequence[AttemptRow]) -> list[str]:
    seen = {r.suite for r in rows if r.event != "import"}
    return [s.name for s in registry if s.name not in seen]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}s"


def _when(x: float | None) -> str:
    return "never" if x is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(x))


_COLOUR = {"passed": "#2da44e", "flaky": "#d4a72c", "quarantined": "#8c959f"}


def _trend_svg(trend: Sequence[str]) -> str:
    if not trend:
        return ""
    cells = "".join(
        f'<rect x="{i * 9}" y="0" width="7" height="14" rx="1" fill="{_COLOUR.get(o, "#cf222e")}">'
        f"<title>{html.escape(o)}</title></rect>" for i, o in enumerate(trend))
    return (f'<svg class="trend" width="{len(trend) * 9}" height="14" role="img" '
            f'aria-label="last {len(trend)} runs: {html.escape(", ".join(trend))}">{cells}</svg>')


_CSS = """
body{font:14px system-ui,sans-serif;margin:24px;color:#1f2328}
h1{font-size:20px} table{border-collapse:collapse;width:100%}
th,td{border-bottom:1px solid #d0d7de;padding:4px 8px;text-align:left;white-space:nowrap}
th{background:#f6f8fa;position:sticky;top:0} td.num{text-align:right}
tr.unrun td{background:#fff8c5} tr.failing td.outcome{color:#cf222e;font-weight:600}
.badge{background:#cf222e;color:#fff;border-radius:8px;padding:1px 8px;font-size:12px}
.note{color:#59636e}
"""


def render_html(rows: Sequence[Row], *, unrecorded: Sequence[str], title: str, generated: float) -> str:
    """The page: a summary line, then one row per test file (self-contained)."""
    unrun = [r for r in rows if r.unrun]
    head = ("file", "suites", "labels", "NUM_GPUS", "hardware", "last outcome", "pass rate",
            "flake rate", "p90 duration", "last run", "trend")
    body = []
    for r in rows:
        cls = "unrun" if r.unrun else "failing" if r.last_outcome and r.last_outcome not in OK else ""
        suites = (html.escape(", ".join(r.suites)) if r.suites
                  else '<span class="badge">no suite runs it</span>')
        cells = [f"<td><code>{html.escape(r.path)}</code></td>", f"<td>{suites}</td>",
                 f"<td>{html.escape(', '.join(r.labels)) or '-'}</td>",
                 f'<td class="num">{r.num_gpus}</td>', f"<td>{html.escape(r.hardware)}</td>",
                 f'<td class="outcome">{html.escape(r.last_outcome or "not run yet")}</td>',
                 f'<td class="num">{_pct(r.pass_rate)}</td>', f'<td class="num">{_pct(r.flake_rate)}</td>',
                 f'<td class="num">{_secs(r.p90)}</td>', f"<td>{_when(r.last_run)}</td>",
                 f"<td>{_trend_svg(r.trend)}</td>"]
        body.append(f'<tr class="{cls}">{"".join(cells)}</tr>')
    missing = (f'<p>Suites no run has recorded: <span class="badge">{html.escape(", ".join(unrecorded))}'
               "</span></p>" if unrecorded else "<p>Every suite has recorded runs.</p>")
    return "\n".join([
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="summary">{len(rows)} test files; {len(unrun)} run by no suite; '
        f"generated {_when(generated)} UTC.</p>", missing,
        "<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>",
        *body, "</tbody></table></body></html>"])


def render_markdown(rows: Sequence[Row], *, unrecorded: Sequence[str], title: str) -> str:
    """The step-summary table: the same columns, the trend as symbols."""
    mark = {"passed": "🟩", "flaky": "🟨", "quarantined": "⬜"}
    lines = [f"### {title}", "",
             f"{len(rows)} test files; {sum(r.unrun for r in rows)} run by no suite."
             + (f" Suites no run has recorded: {', '.join(unrecorded)}." if unrecorded else ""), "",
             "| file | suites | labels | NUM_GPUS | hardware | last outcome | pass rate | flake rate | "
             "p90 | last run | trend |", "|---|---|---|---:|---|---|---:|---:|---:|---|---|"]
    for r in rows:
        suites = ", ".join(r.suites) if r.suites else "**no suite runs it**"
        trend = "".join(mark.get(o, "🟥") for o in r.trend)
        lines.append(f"| `{r.path}` | {suites} | {', '.join(r.labels) or '-'} | {r.num_gpus} | "
                     f"{r.hardware} | "
                     f"{r.last_outcome or 'not run yet'} | {_pct(r.pass_rate)} | {_pct(r.flake_rate)} | "
                     f"{_secs(r.p90)} | {_when(r.last_run)} | {trend} |")
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `python -m ci coverage --help`)")


def main(argv: Sequence[str]) -> int:
    p = _Parser(prog="python -m ci coverage", allow_abbrev=False,
                description="Write the coverage page (HTML) and its Markdown table from the registry "
                            "and the run history.",
                epilog="Exit codes: 0 written, 2 bad input. An unusable store still writes the page, "
                       "without history (one warning line).")
    p.add_argument("--history", metavar="URL", help="store URL (default: SLIME_CI_HISTORY_URL, else "
                                                   ".ci-cache/history.sqlite)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: .)")
    p.add_argument("--out", type=Path, help=f"directory for index.html and coverage.md (default: {OUT_DIR})")
    args = p.parse_args(list(argv))
    root = args.root.resolve()
    if not (root / "tests").is_dir():
        raise UsageError(f"{root} has no tests/ directory; run from the repository root or pass --root")
    registry = load_registry(root)
    files = discover(root)
    url = resolve_url(args.history, os.environ, root)
    history: list[AttemptRow] = []
    if url is not None:
        try:
            with open_store(url, create=False) as store:  # a page never makes a store
                history = store.attempts(last_runs=5000)
        except StoreError as exc:
            print(f"warning: coverage without history ({exc})")
    rows = build_rows(registry, files, history)
    unrecorded = unrecorded_suites(registry, history)
    title = f"Test coverage: {root.name}"
    out = (args.out or root / OUT_DIR).resolve()
    out.mkdir(parents=True, exist_ok=True)
    page = out / "index.html"
    page.write_text(render_html(rows, unrecorded=unrecorded, title=title, generated=time.time()),
                    encoding="utf-8")
    md = render_markdown(rows, unrecorded=unrecorded, title=title)
    (out / "coverage.md").write_text(md + "\n", encoding="utf-8")
    Log.from_env().summary(md)
    print(f"coverage: {len(rows)} test files, {sum(r.unrun for r in rows)} run by no suite, "
          f"{len(unrecorded)} suite(s) never recorded; page: {page}")
    return EXIT_OK
