"""The main grid, built by `python -m ci hud` from a real store with a planted history: exactly
the planted cells, each with its class and the link to its run; the first red commit of each
streak marked, with the bisect answer where the history holds one."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
import _hud_history as planted
from _ci import REPO, run_ci

from ci.history.store import AttemptRow
from ci.hud import grid

NUM_GPUS = 0


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hud")
    url = planted.store_url(folder)
    uids = planted.plant(url)
    proc = run_ci("hud", "--out", str(folder / "site"), "--history", url, "--root", str(REPO),
                  "--repo", "acme/slime")
    assert proc.returncode == 0, proc.stderr
    return folder / "site", uids


def test_the_grid_holds_exactly_the_planted_cells_with_their_class_and_link(site):
    out, uids = site
    entries, cells = planted.grid_cells((out / "index.html").read_text(encoding="utf-8"))
    assert sorted(entries) == sorted([*planted.UNIT, planted.JOB])
    want = {(planted.sha(i), e): planted.expected(i, e)
            for i in range(planted.COMMITS) for e in entries}
    assert len(cells) == len(want) == 50 * 8
    got = {k: v[0].split()[0] for k, v in cells.items()}
    assert got == want
    for (sha, entry), (_cls, href, _label) in cells.items():
        i = next(n for n in range(planted.COMMITS) if planted.sha(n) == sha)
        if want[(sha, entry)] == "not-run":
            assert href == ""
            continue
        suite = "train" if entry == planted.JOB else "unit"
        assert href == f"r/{uids[(i, suite)][:10]}.html", (entry, i)
        run_page = (out / href).read_text(encoding="utf-8")
        assert sha in run_page and uids[(i, suite)] in run_page


def test_the_first_red_commit_of_each_streak_is_marked_with_its_bisect_answer(site):
    out, _uids = site
    _entries, cells = planted.grid_cells((out / "index.html").read_text(encoding="utf-8"))
    marked = {k for k, v in cells.items() if "first" in v[0].split()}
    assert marked == {(planted.sha(i), e) for i, e in planted.first_reds()}
    current = cells[(planted.sha(45), "tests/test_streak.py")][2]
    assert "first red commit of 5 in a row" in current
    assert f"bisect: tests/test_streak.py: first bad commit {planted.sha(45)[:10]}" in current
    ended = cells[(planted.sha(20), "tests/test_streak.py")][2]
    assert "first red commit of 2 in a row" in ended and "no bisect answer yet" in ended
    # The verdict table's own words: a new failure after passing runs; the next one already failing.
    assert "new (rule new)" in ended
    assert "already failing on main (rule main-failed-last)" in cells[(planted.sha(21), "tests/test_streak.py")][2]
    assert "infrastructure (rule node-lost)" in cells[(planted.sha(33), "tests/test_lost.py")][2]
    assert "flaky (rule flaky-retry)" in cells[(planted.sha(10), "tests/test_flaky.py")][2]
    held = cells[(planted.sha(47), "tests/test_held.py")][2]
    assert "quarantined: flake rate 20% (10 of 50 runs) is above 10%" in held
    index = (out / "index.html").read_text(encoding="utf-8")
    assert "<h2>Streaks</h2>" in index and len(re.findall(r"first red commit of \d+ in a row", index)) == 3


def _row(i: int, entry: str, outcome: str, *, run: str = "", attempt: int = 1, final: bool = True,
         reason: str = "") -> AttemptRow:
    return AttemptRow(run_uid=run or f"run{i}", suite="unit", commit=f"c{i}", branch="main", event="push",
                      hardware="cpu", started_at=1000.0 + i, entry_id=entry, path=entry, attempt=attempt,
                      final=final, outcome=outcome, seconds=1.0, reason=reason, num_gpus=0)


def test_a_commit_that_failed_in_one_run_and_passed_in_another_is_flaky_and_breaks_no_streak():
    rows = [_row(0, "t", "passed"), _row(1, "t", "failed", reason="boom"),
            _row(1, "t", "passed", run="again"), _row(2, "t", "failed", reason="boom"),
            _row(3, "t", "failed", reason="boom")]
    g = grid.build(rows, last=10, rules={}, held_now={})
    col = g.columns[0]
    assert [g.cell(f"c{i}", col).kind for i in range(4)] == ["pass", "flaky", "fail", "fail"]
    assert "passed in run again" in g.cell("c1", col).evidence
    assert [g.cell(f"c{i}", col).first_red for i in range(4)] == [False, False, True, False]
    assert g.cell("c2", col).streak == 2


def test_infrastructure_and_unrun_commits_neither_break_nor_extend_a_streak():
    rows = [_row(0, "t", "passed"), _row(1, "t", "failed", reason="x"), _row(2, "t", "lost", reason="node"),
            _row(3, "u", "passed"), _row(4, "t", "failed", reason="x")]
    g = grid.build(rows, last=10, rules={}, held_now={})
    t = next(c for c in g.columns if c.entry_id == "t")
    assert [g.cell(f"c{i}", t).kind for i in range(5)] == ["pass", "fail", "infra", "not-run", "fail"]
    assert g.cell("c1", t).first_red and g.cell("c1", t).streak == 2 and not g.cell("c4", t).first_red


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
