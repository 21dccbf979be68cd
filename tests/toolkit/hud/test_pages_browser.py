"""The HUD in headless Chromium (Debian's `chromium`, driven over its DevTools protocol): no
console error, every cell reachable by keyboard with its verdict shown on focus, a test named
`<img src=x onerror=alert(1)>` shown as text and never run, screenshots at 1280 and 390 px.

Without Chromium the tests skip and say so (.ci/services.sh installs it). With
SLIME_CI_HUD_SCREENSHOTS=DIR the screenshots are also copied there (docs/images/ holds them).
"""

import asyncio
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
import _hud_history as planted
from _cdp import browser, chromium
from _ci import run_ci, write

from ci.hud import pages

NUM_GPUS = 0
# A browser per test, a Tab per cell: about 40 s on the 2-core machine.
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(browser() is None, reason="no Chromium here (apt-get install chromium; "
                                                           ".ci/services.sh installs it)")]

# Where the keyboard focus is: a grid cell as "row:column", anything else by its link.
FOCUSED = """(() => { const e = document.activeElement; const td = e && e.closest('.grid td');
  if (td) return td.parentElement.rowIndex + ':' + td.cellIndex;
  return e === document.body ? 'body' : e.tagName + ' ' + (e.getAttribute('href') || ''); })()"""
CELLS = """[...document.querySelectorAll('.grid td')].map(td => td.parentElement.rowIndex + ':' + td.cellIndex)"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hud")
    root = write(folder / "repo", {"ci/registry/repo_suites.py": planted.REGISTRY})
    url = planted.store_url(folder)
    planted.plant(url)
    proc = run_ci("hud", "--out", str(folder / "site"), "--history", url, "--root", str(root),
                  "--repo", "acme/slime", "--include-prs")
    assert proc.returncode == 0, proc.stderr
    assert (folder / "site" / "hud.css").is_file()
    return folder / "site"


def _keep(shot: Path) -> None:
    where = os.environ.get("SLIME_CI_HUD_SCREENSHOTS", "")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(where) / shot.name)


async def _every_page_loads_quietly(site: Path, tmp: Path) -> dict[str, object]:
    seen: dict[str, object] = {}
    async with chromium(tmp / "profile") as page:
        for width in (1280, 390):
            await page.open((site / "index.html").as_uri(), width=width)
            assert page.complaints() == []
            shot = tmp / f"hud-grid-{width}.png"
            await page.screenshot(shot)
            assert shot.stat().st_size > 10_000
            _keep(shot)
            # The page never scrolls sideways: the grid scrolls inside its own box.
            seen[f"overflow{width}"] = await page.value("document.documentElement.scrollWidth")
            if width == 1280:  # what focus shows: the newest streak's first red cell and its bisect
                await page.value("document.querySelectorAll('.grid a.first')[0].focus()")
                shot = tmp / "hud-grid-focus-1280.png"
                await page.screenshot(shot)
                _keep(shot)
            seen[f"load{width}"] = await page.value(
                "performance.getEntriesByType('navigation')[0].loadEventEnd")
        for rel in (pages.entry_href("unit", "tests/test_held.py"), pages.entry_href("train", planted.JOB),
                    pages.entry_href("unit", planted.XSS), "gpu.html", "p/7.html"):
            await page.open((site / rel).as_uri(), width=1280)
            assert page.complaints() == [], rel
            if rel == pages.entry_href("unit", "tests/test_held.py"):
                shot = tmp / "hud-entry-1280.png"
                await page.screenshot(shot)
                _keep(shot)
    return seen


def test_every_page_loads_with_no_console_error_and_fits_a_phone(site, tmp_path):
    seen = asyncio.run(_every_page_loads_quietly(site, tmp_path))
    assert seen["overflow1280"] == 1280 and seen["overflow390"] == 390
    assert 0 < float(str(seen["load1280"])) < 1000  # ms, for 50 commits x 8 entries


async def _tab_through(site: Path, tmp: Path) -> tuple[set[str], list[str], dict[str, str]]:
    async with chromium(tmp / "profile") as page:
        await page.open((site / "index.html").as_uri(), width=1280)
        every = await page.value(CELLS)
        reached: list[str] = []
        tips: dict[str, str] = {}
        for _ in range(len(every) + 200):
            await page.key("Tab", 9)
            where = await page.value(FOCUSED)
            if where in reached:
                break
            reached.append(where)
            if ":" in where and where.split(":")[0] in ("3", "7"):  # two rows: what focus shows
                tips[where] = await page.value("getComputedStyle(document.activeElement, '::after').content")
        assert page.complaints() == []
        return set(every), reached, tips


def test_every_cell_is_reachable_by_keyboard_and_shows_its_verdict_on_focus(site, tmp_path):
    every, reached, tips = asyncio.run(_tab_through(site, tmp_path))
    assert len(every) == 50 * 8
    assert every <= set(reached), f"{len(every - set(reached))} cells never got the focus"
    # In order: row by row, newest commit first, each row left to right.
    cells = [r for r in reached if r in every]
    assert cells == sorted(cells, key=lambda rc: tuple(map(int, rc.split(":"))))
    # Row 3 is the newest commit (two head rows): tests/test_streak.py failing there, by its verdict.
    assert any("already failing on main" in t for t in tips.values()), tips
    assert all(t.startswith('"') and len(t) > 10 for t in tips.values())


async def _xss(site: Path, tmp: Path) -> dict[str, object]:
    async with chromium(tmp / "profile") as page:
        out: dict[str, object] = {}
        for rel in ("index.html", pages.entry_href("unit", planted.XSS)):
            await page.open((site / rel).as_uri(), width=1280)
            out[rel] = {
                "complaints": page.complaints(),
                "images": await page.value("document.images.length"),
                "scripts": await page.value("document.scripts.length"),
                "text": await page.value("document.body.innerText"),
            }
        return out


def test_a_test_named_as_markup_is_shown_as_text_and_never_run(site, tmp_path):
    seen = asyncio.run(_xss(site, tmp_path))
    for rel, page in seen.items():
        assert isinstance(page, dict)
        assert page["complaints"] == [] and page["images"] == 0 and page["scripts"] == 0, rel
        assert planted.XSS in str(page["text"]), rel
    entry = seen[pages.entry_href("unit", planted.XSS)]
    assert isinstance(entry, dict) and planted.XSS_REASON in str(entry["text"])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
