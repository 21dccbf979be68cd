"""The HUD's pages as HTML text: the grid, an entry, a run, a pull request, the GPUs. Pure.

Every string that comes from the store (entry ids, reasons, hosts, branch names) passes
through `esc` before it reaches the page: a test named `<img src=x onerror=alert(1)>` is
shown as text. The pages hold no script at all; hover and keyboard focus show a cell's
verdict through CSS alone.
"""

from __future__ import annotations

import hashlib
import html
import time
from collections.abc import Iterable, Mapping, Sequence

from ci.history.job_times import Wait, summary
from ci.history.store import AttemptRow
from ci.history.verdicts import Verdict
from ci.hud import svg
from ci.hud.entry_page import EntryView
from ci.hud.gpu_use import NOT_RECORDED, HostDay
from ci.hud.grid import Cell, Column, Grid

STYLE = "hud.css"
WAITS_SHOWN = 30  # the index says what pull requests waited for over their last this many runs
COMMIT_W, CELL_W = 210, 16  # px: the commit column and one cell (ci/hud/style.py agrees)
LEGEND = (("pass", "passed"), ("fail", "failed"), ("flaky", "flaky"), ("infra", "infrastructure"),
          ("quarantined", "quarantined"), ("not-run", "not run"))


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def slug(suite: str, entry_id: str) -> str:
    """A file name for an entry's page: entry ids hold slashes, spaces and anything else."""
    return hashlib.sha256(f"{suite}\0{entry_id}".encode()).hexdigest()[:16]


def entry_href(suite: str, entry_id: str, up: str = "") -> str:
    return f"{up}e/{slug(suite, entry_id)}.html"


def run_href(uid: str, up: str = "") -> str:
    return f"{up}r/{uid[:10]}.html"


def when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(epoch))


def short_name(entry_id: str) -> str:
    """An entry's id without its directory and `.py` (its arguments kept)."""
    path, _, args = entry_id.partition(" ")
    stem = path.rsplit("/", 1)[-1].removesuffix(".py")
    return f"{stem} {args}" if args else stem


def page(title: str, body: str, *, up: str = "", generated: float) -> str:
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title>"
            f'<link rel="stylesheet" href="{up}{STYLE}"></head><body>'
            f'<header><h1>{esc(title)}</h1><nav><a href="{up}index.html">grid</a>'
            f'<a href="{up}gpu.html">GPUs</a></nav>'
            f'<span class="note">built {when(generated)} UTC</span></header>\n{body}\n</body></html>\n')


def _commit_link(sha: str, repo: str) -> str:
    text = f"<code>{esc(sha[:10])}</code>"
    return f'<a href="https://github.com/{esc(repo)}/commit/{esc(sha)}">{text}</a>' if repo and sha else text


def _label(column: Column, cell: Cell, sha: str) -> str:
    # The common cells say little (10,000 of them must fit in a megabyte); the rest say all.
    if cell.kind == "pass":
        return f"{short_name(column.entry_id)}: {cell.verdict} {cell.seconds:.0f} s"
    if cell.kind == "not-run":
        return f"{short_name(column.entry_id)}: not run"
    text = f"{column.entry_id} on {sha[:10]}: {cell.verdict}: {cell.evidence}"
    if cell.first_red:
        text += f"\nfirst red commit of {cell.streak} in a row"
        text += f"\nbisect: {cell.bisect}" if cell.bisect else "\nno bisect answer yet"
    return text


def _cell_html(column: Column, cell: Cell, sha: str) -> str:
    # </td> is implied by the next <td>: 10,000 cells, five bytes each.
    label = esc(_label(column, cell, sha))
    if not cell.run_uid:
        return f'<td><span class=not-run tabindex=0 aria-label="{label}"></span>'
    cls = f"{cell.kind} first" if cell.first_red else cell.kind
    quoted = f'"{cls}"' if " " in cls else cls
    return f'<td><a class={quoted} href={run_href(cell.run_uid)} aria-label="{label}"></a>'


def grid_html(grid: Grid, *, repo: str) -> str:
    suites: list[tuple[str, int]] = []
    for c in grid.columns:
        if suites and suites[-1][0] == c.suite:
            suites[-1] = (c.suite, suites[-1][1] + 1)
        else:
            suites.append((c.suite, 1))
    # Fixed layout, its widths from the columns: the browser lays out 10,000 cells in one pass.
    width = COMMIT_W + CELL_W * len(grid.columns)
    head = [f'<table class="grid" style="width:{width}px"><colgroup><col class="cc">'
            f'<col span="{max(1, len(grid.columns))}" class="ce"></colgroup><thead><tr><th></th>']
    head += [f'<th class="suite" colspan="{n}" title="{esc(s)}">{esc(s)}</th>' for s, n in suites]
    head.append("</tr><tr><th>commit</th>")
    head += [f'<th class="e"><a href="{entry_href(c.suite, c.entry_id)}" title="{esc(c.entry_id)}">'
             f"{esc(short_name(c.entry_id))}</a></th>" for c in grid.columns]
    head.append("</tr></thead><tbody>")
    body = []
    for commit in grid.commits:
        cells = "".join(_cell_html(col, grid.cell(commit.sha, col), commit.sha) for col in grid.columns)
        body.append(f"<tr><th>{_commit_link(commit.sha, repo)} {when(commit.at)}</th>{cells}</tr>\n")
    return "".join(head) + "\n" + "".join(body) + "</tbody></table>"


def _legend() -> str:
    keys = "".join(f'<span><i class="{k}"></i>{esc(t)}</span>' for k, t in LEGEND)
    return f'<p class="legend">{keys}<span>&#9650; first red commit of a streak</span></p>'


def streak_rows(grid: Grid, repo: str) -> str:
    rows = []
    for commit in grid.commits:
        for col in grid.columns:
            cell = grid.cell(commit.sha, col)
            if cell.first_red:
                rows.append(f"<tr><td>{esc(col.suite)}</td>"
                            f'<td><a href="{entry_href(col.suite, col.entry_id)}">'
                            f"{esc(col.entry_id)}</a></td><td>{_commit_link(commit.sha, repo)}</td>"
                            f"<td>{cell.streak}</td><td>{esc(cell.bisect) or 'none yet'}</td></tr>")
    if not rows:
        return "<h2>Streaks</h2><p class=\"empty\">No entry failed on these commits.</p>"
    return ('<h2>Streaks</h2><table class="rows"><thead><tr><th>suite</th><th>entry</th>'
            "<th>first red commit</th><th>commits in a row</th><th>bisect answer</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def index(grid: Grid, *, branch: str, repo: str, prs: Sequence[int], generated: float,
          waits: Sequence[Wait] = ()) -> str:
    prs_html = ""
    if prs or waits:
        links = " ".join(f'<a href="p/{n}.html">#{n}</a>' for n in prs)
        prs_html = ("<h2>Pull requests</h2>" + f'<p class="note">{esc(summary(waits, last=WAITS_SHOWN))}</p>'
                    + (f"<p>{links}</p>" if prs else ""))
    intro = (f'<p class="note">The last {len(grid.commits)} commits of <code>{esc(branch)}</code> that '
             f"trusted runs tested, newest first, by {len(grid.columns)} entries. Hover or focus a cell "
             "(Tab) for its verdict and evidence; a cell links to its run, a column head to the "
             "entry.</p>")
    body = (intro + _legend() + f'<div class="scroll">{grid_html(grid, repo=repo)}</div>'
            + streak_rows(grid, repo) + prs_html)
    return page(f"{branch}: runs at a glance", body, generated=generated)


def entry(view: EntryView, *, repo: str, generated: float) -> str:
    f = view.flakes
    rate = (f"{f.rate:.0%} ({f.flakes} of {f.runs} runs: {f.retried} passed on a retry, {f.split} failed "
            f"on a commit where it also passed)" if f is not None else "no runs")
    held = "not quarantined"
    if view.held:
        issue = (f' &middot; <a href="{esc(view.issue_url)}">its issue</a>' if view.issue_url
                 else " &middot; its issue is kept by <code>python -m ci issues</code>")
        held = f"<strong>quarantined</strong>: {esc(view.held)}{issue}"
    facts = (f'<table class="rows"><tr><th>suite</th><td>{esc(view.suite)}</td></tr>'
             f"<tr><th>entry</th><td><code>{esc(view.entry_id)}</code></td></tr>"
             f"<tr><th>runs</th><td>{view.runs}</td></tr>"
             f'<tr><th>flake rate</th><td class="flake-rate">{esc(rate)}</td></tr>'
             f'<tr><th>quarantine</th><td class="held">{held}</td></tr></table>')
    charts = [svg.lines([svg.Series(label="p50", css="s1", points=[(p.at, p.value) for p in view.p50]),
                         svg.Series(label="p90", css="s2", points=[(p.at, p.value) for p in view.p90])],
                        title="seconds (passing runs)"),
              svg.lines([svg.Series(label="flake rate", css="s3",
                                    points=[(p.at, p.value) for p in view.flake_rate])],
                        title="flake rate (last 50 runs)", percent=True)]
    charts += [svg.lines([svg.Series(label=name, css="s1", points=[(p.at, p.value) for p in points])],
                         title=f"gated metric {name} (last step)", zero=False)
               for name, points in view.metrics.items()]
    rows = "".join(f'<tr><td><a href="{run_href(x.run_uid, "../")}">{esc(x.run_uid[:8])}</a></td>'
                   f"<td>{_commit_link(x.commit, repo)}</td><td>{when(x.at)}</td><td>{x.attempt}</td>"
                   f"<td>{esc(x.outcome)}</td><td>{esc(x.infra or 'the code')}</td>"
                   f'<td class="reason">{esc(x.reason)}</td></tr>' for x in view.failures)
    failures = ('<h2>Last failures</h2><table class="rows failures"><thead><tr><th>run</th><th>commit</th>'
                "<th>when</th><th>attempt</th><th>outcome</th><th>cause</th><th>reason</th></tr></thead>"
                f"<tbody>{rows}</tbody></table>" if rows
                else '<h2>Last failures</h2><p class="empty">none</p>')
    body = facts + '<h2>Trends</h2><div class="charts">' + "".join(charts) + "</div>" + failures
    return page(short_name(view.entry_id), body, up="../", generated=generated)


def _verdict_cell(v: Verdict | None, cell: Cell | None) -> str:
    if v is not None:
        return (f"<td>{esc(v.label)} <code>{esc(v.rule)}</code></td>"
                f'<td class="reason">{esc(v.evidence)}</td>')
    if cell is not None and cell.kind != "pass":
        return f"<td>{esc(cell.verdict)}</td><td class=\"reason\">{esc(cell.evidence)}</td>"
    return "<td></td><td></td>"


def run_page(rows: Sequence[AttemptRow], *, repo: str, generated: float,
             verdicts: Mapping[str, Verdict] | None = None,
             cells: Mapping[str, Cell] | None = None) -> str:
    """One run's attempts, with the verdict of each entry that did not pass."""
    first = rows[0]
    head = (f'<table class="rows"><tr><th>run</th><td><code>{esc(first.run_uid)}</code></td></tr>'
            f"<tr><th>suite</th><td>{esc(first.suite)}</td></tr>"
            f"<tr><th>commit</th><td>{_commit_link(first.commit, repo)} on {esc(first.branch)}"
            f"{f' (PR #{first.pr})' if first.pr else ''}</td></tr>"
            f"<tr><th>started</th><td>{when(first.started_at)} UTC, {esc(first.hardware)}, "
            f"{'trusted' if first.trusted else 'untrusted (a pull request’s code)'}</td></tr></table>")
    out = []
    for r in rows:
        v = (verdicts or {}).get(r.entry_id) if r.final else None
        c = (cells or {}).get(r.entry_id) if r.final else None
        name = (f'<a href="{entry_href(r.suite, r.entry_id, "../")}">{esc(r.entry_id)}</a>' if r.trusted
                else esc(r.entry_id))
        out.append(f"<tr><td>{name}</td><td>{r.attempt}{'' if r.final else ' (retried)'}</td>"
                   f"<td>{esc(r.outcome)}</td><td>{r.seconds:.1f}</td><td>{esc(r.node)}</td>"
                   f'<td class="reason">{esc(r.reason)}</td>{_verdict_cell(v, c)}</tr>')
    table = ('<table class="rows attempts"><thead><tr><th>entry</th><th>attempt</th><th>outcome</th>'
             "<th>seconds</th><th>node</th><th>reason</th><th>verdict</th><th>evidence</th></tr></thead>"
             f"<tbody>{''.join(out)}</tbody></table>")
    return page(f"run {first.run_uid[:8]} ({first.suite})", head + table, up="../",
                generated=generated)


def gpu(days: Iterable[HostDay], *, generated: float) -> str:
    rows = "".join(f"<tr><td>{esc(d.host)}</td><td>{d.day}</td><td>{d.gpus}</td>"
                   f"<td>{svg.bar(d.busy, label=f'{d.busy:.0%} busy')}</td>"
                   f"<td>{d.gpu_seconds / 3600:.1f}</td><td>{d.attempts}</td><td>{d.runs}</td></tr>"
                   for d in days)
    table = ('<table class="rows"><thead><tr><th>host</th><th>day (UTC)</th><th>GPUs</th><th>busy</th>'
             "<th>GPU-hours</th><th>attempts</th><th>runs</th></tr></thead>"
             f"<tbody>{rows}</tbody></table>" if rows else '<p class="empty">No GPU attempt recorded.</p>')
    return page("GPUs", f'<p class="note">{esc(NOT_RECORDED)}</p>{table}', generated=generated)


def pr_page(number: int, verdicts: Sequence[Verdict], rows: Sequence[AttemptRow], *, repo: str,
            generated: float) -> str:
    """A pull request's latest commit: every entry its runs there ran, with the verdict of each
    that did not pass (judged against the trusted history, as its `verdict` check is)."""
    by_entry = {(v.suite, v.entry_id): v for v in verdicts}
    finals = [r for r in rows if r.final]
    head = rows[-1].commit if rows else ""
    out = []
    for r in sorted(finals, key=lambda r: (r.suite, r.entry_id)):
        v = by_entry.get((r.suite, r.entry_id))
        out.append(f"<tr><td>{esc(r.suite)}</td><td>{esc(r.entry_id)}</td><td>{esc(r.outcome)}</td>"
                   f'<td><a href="{run_href(r.run_uid, "../")}">{esc(r.run_uid[:8])}</a></td>'
                   f"{_verdict_cell(v, None)}</tr>")
    table = ('<table class="rows verdicts"><thead><tr><th>suite</th><th>entry</th><th>outcome</th>'
             "<th>run</th><th>verdict</th><th>evidence</th></tr></thead>"
             f"<tbody>{''.join(out)}</tbody></table>")
    intro = (f'<p class="note">The runs of its latest tested commit {_commit_link(head, repo)}; '
             f"{len(verdicts)} entr{'y' if len(verdicts) == 1 else 'ies'} did not pass.</p>")
    return page(f"pull request #{number}", intro + table, up="../", generated=generated)
