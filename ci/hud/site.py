"""The site: every page of the HUD from one read of the history, written into one folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.history.store import AttemptRow
from ci.history.verdicts import SuiteRules, head_rows, judge
from ci.hud import entry_page, gpu_use, grid, pages
from ci.hud.read import History
from ci.hud.style import CSS


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What a build shows, resolved once from the command line and the registry."""

    branch: str = "main"
    commits: int = 50
    repo: str = ""  # owner/name: commit and issue links; "" leaves them out
    rules: Mapping[str, SuiteRules]  # suite -> its verdict rules
    held: Mapping[tuple[str, str], str]  # (suite, entry) -> why the registry holds it
    quarantine: Mapping[str, tuple[float | None, int, int]]  # suite -> (rate, min runs, clean runs)
    lifts: Mapping[tuple[str, str], float]
    # A suite the registry does not declare (a store of another checkout): the registry's default.
    quarantine_default: tuple[float | None, int, int] = (None, 0, 0)
    suite_order: Sequence[str] = ()
    generated: float


@dataclass(frozen=True, kw_only=True)
class Built:
    pages: int
    bytes_main: int
    cells: int
    folder: Path


def _write(folder: Path, rel: str, text: str) -> int:
    path = folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8")
    path.write_bytes(data)
    return len(data)


def render(history: History, s: Settings) -> dict[str, str]:
    """Every page of the site: relative path -> HTML (or CSS)."""
    rows = list(history.main)
    held_now = grid.held(rows, registry=s.held, rates=s.quarantine, lifts=s.lifts,
                          default=s.quarantine_default)
    g = grid.build(rows, last=s.commits, rules=s.rules, held_now=held_now, bisects=history.bisects,
                   suite_order=s.suite_order, branch=s.branch)
    by_entry: dict[tuple[str, str], list[AttemptRow]] = defaultdict(list)
    by_run: dict[str, list[AttemptRow]] = defaultdict(list)
    for r in rows:
        by_entry[(r.suite, r.entry_id)].append(r)
        by_run[r.run_uid].append(r)
    prs: dict[int, list[AttemptRow]] = defaultdict(list)
    for r in history.prs:
        if r.pr is not None:
            prs[r.pr].append(r)
            by_run[r.run_uid].append(r)
    out: dict[str, str] = {pages.STYLE: CSS}
    out["index.html"] = pages.index(g, branch=s.branch, repo=s.repo, prs=sorted(prs, reverse=True),
                                    waits=history.waits,
                                    generated=s.generated)
    for col in g.columns:
        metrics = {name: series for (entry, name), series in history.metrics.items() if entry == col.entry_id}
        view = entry_page.build(col.suite, col.entry_id, by_entry[(col.suite, col.entry_id)],
                                held=held_now.get((col.suite, col.entry_id), ""), repo=s.repo,
                                metrics=metrics)
        out[pages.entry_href(col.suite, col.entry_id)] = pages.entry(view, repo=s.repo, generated=s.generated)
    # A page per run the grid links to: its attempts and the verdicts the cells show.
    cells_of_run: dict[str, dict[str, grid.Cell]] = defaultdict(dict)
    for (_sha, col), cell in g.cells.items():
        if cell.run_uid:
            cells_of_run[cell.run_uid][col.entry_id] = cell
    for uid, cells in cells_of_run.items():
        out[pages.run_href(uid)] = pages.run_page(by_run[uid], repo=s.repo, cells=cells,
                                                  generated=s.generated)
    for number, pr_rows in prs.items():
        latest = head_rows(pr_rows)
        verdicts = judge(latest, rows, base=None, suites=s.rules, branch=s.branch)
        out[f"p/{number}.html"] = pages.pr_page(number, verdicts, latest, repo=s.repo, generated=s.generated)
        for uid in {r.run_uid for r in latest}:
            mine = {v.entry_id: v for v in verdicts if v.run_uid == uid}
            out[pages.run_href(uid)] = pages.run_page(by_run[uid], repo=s.repo, verdicts=mine,
                                                      generated=s.generated)
    out["gpu.html"] = pages.gpu(gpu_use.per_host_day(history.gpu), generated=s.generated)
    return out


def write(files: Mapping[str, str], folder: Path) -> Built:
    """Write the site into `folder`, replacing what a previous build left there: the pages are
    written beside it first and moved in at the end, so a failed build leaves the old site."""
    folder = folder.resolve()
    folder.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        sizes = {rel: _write(fresh, rel, text) for rel, text in files.items()}
        if folder.exists():
            old = folder.with_name(f".{folder.name}-old-{os.getpid()}")
            folder.rename(old)
            fresh.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            fresh.rename(folder)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    cells = files["index.html"].count("aria-label=")  # the grid's cells alone carry one
    return Built(pages=sum(rel.endswith(".html") for rel in files), bytes_main=sizes["index.html"],
                 cells=cells, folder=folder)
