"""An entry's page, from a real store with a planted history: the planted flake rate, the
quarantine and its issue, the last failures with their reasons, the trends as inline SVG,
and the gated metric's chart."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
import _hud_history as planted
from _ci import run_ci, write

from ci.hud import pages

NUM_GPUS = 0


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hud")
    root = write(folder / "repo", {"ci/registry/repo_suites.py": planted.REGISTRY})
    url = planted.store_url(folder)
    planted.plant(url)
    proc = run_ci("hud", "--out", str(folder / "site"), "--history", url, "--root", str(root),
                  "--repo", "acme/slime")
    assert proc.returncode == 0, proc.stderr
    return folder / "site"


def _page(site: Path, suite: str, entry: str) -> str:
    return (site / pages.entry_href(suite, entry)).read_text(encoding="utf-8")


def test_the_held_entry_shows_its_planted_flake_rate_quarantine_and_issue(site):
    text = _page(site, "unit", "tests/test_held.py")
    rate = re.search(r'<td class="flake-rate">([^<]*)</td>', text)
    assert rate and rate.group(1) == ("20% (10 of 50 runs: 10 passed on a retry, 0 failed on a commit "
                                      "where it also passed)")
    assert "<strong>quarantined</strong>: flake rate 20% (10 of 50 runs) is above 10%" in text
    issue = re.search(r'href="(https://github.com/acme/slime/issues\?q=[^"]+)">its issue', text)
    assert issue and "label%3Aslime-ci%20in%3Atitle%20%22Flaky%3A%20tests%2Ftest_held.py%22" in issue.group(1)
    # Its ten flakes, newest first, each with its reason and the link to its run.
    failures = re.findall(r'<tr><td><a href="\.\./r/(\w+)\.html">', text)
    assert len(failures) == 10
    assert text.index("port 9047 busy") < text.index("port 9002 busy")
    assert all((site / "r" / f"{uid}.html").is_file() for uid in failures)


def test_an_entry_below_the_threshold_shows_its_rate_and_is_not_held(site):
    text = _page(site, "unit", "tests/test_flaky.py")
    assert '<td class="flake-rate">4% (2 of 50 runs: 2 passed on a retry' in text
    assert '<td class="held">not quarantined</td>' in text


def test_the_trends_are_inline_svg_and_the_rate_ends_at_the_planted_one(site):
    text = _page(site, "unit", "tests/test_held.py")
    assert text.count("<svg") == 2  # durations (p50, p90) and the flake rate; no gate
    assert "<script" not in text and "http://" not in text
    last = re.findall(r"<title>flake rate: (\d+)%</title>", text)
    assert last == ["20"]


def test_the_gated_entry_charts_the_metric_its_gate_watches(site):
    text = _page(site, "train", planted.JOB)
    assert text.count("<svg") == 3 and "gated metric reward (last step)" in text
    # The last step's value of the newest run (commit 48): 0.1 * 5 + 48 / 100.
    assert "<title>reward: 0.98</title>" in text


def test_a_stored_entry_name_and_reason_are_shown_as_text(site):
    text = _page(site, "unit", planted.XSS)
    assert "<img" not in text and "<script>" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text and "&lt;script&gt;alert(2)&lt;/script&gt;" in text


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
