"""The GPU page: busy fraction per host and day from the attempts the store holds, and a
note that says what it does not hold (queue waits, backfills)."""

import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
import _hud_history as planted
from _ci import REPO, run_ci

from ci.history.store import open_store
from ci.hud.gpu_use import DAY, per_host_day
from ci.hud.read import GpuAttempt, gpu_attempts

NUM_GPUS = 0


def test_busy_fraction_per_host_and_day_from_a_planted_store(tmp_path):
    url = planted.store_url(tmp_path)
    planted.plant(url)
    with open_store(url, create=False) as store:
        rows = gpu_attempts(store, since=0.0)
    # What was planted: 2 GPUs for 600 s on every even commit, on host gpu-a, devices up to 3.
    want: dict[str, float] = defaultdict(float)
    for i in range(0, planted.COMMITS, 2):
        want[time.strftime("%Y-%m-%d", time.gmtime(planted.T0 + i * planted.STEP + 120))] += 2 * 600.0
    days = per_host_day(rows)
    assert {d.host for d in days} == {"gpu-a"} and all(d.gpus == 4 for d in days)
    assert {d.day: d.gpu_seconds for d in days} == want
    assert [d.day for d in days] == sorted(want, reverse=True)
    first = next(d for d in days if d.day == "2026-11-01")
    assert first.busy == pytest.approx(4 * 1200.0 / (4 * DAY)) and first.runs == 4


def test_a_host_with_no_device_list_counts_the_gpus_its_attempts_asked_for():
    rows = [GpuAttempt(host="", run_uid="r", started_at=0.0, ended_at=10.0, num_gpus=8, devices="",
                       seconds=DAY)]
    (only,) = per_host_day(rows)
    assert (only.host, only.gpus, only.busy) == ("(unknown host)", 8, 1.0)


def test_the_page_shows_the_hosts_and_says_what_the_store_does_not_hold(tmp_path):
    url = planted.store_url(tmp_path)
    planted.plant(url)
    proc = run_ci("hud", "--out", str(tmp_path / "site"), "--history", url, "--root", str(REPO),
                  env={"GITHUB_REPOSITORY": ""})
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "site" / "gpu.html").read_text(encoding="utf-8")
    assert "Queue waits (p50/p90) and backfills are not in the history store" in text
    assert text.count("<tr><td>gpu-a</td>") == 7  # the planted commits span seven days
    assert "<td>2026-11-01</td><td>4</td>" in text


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
