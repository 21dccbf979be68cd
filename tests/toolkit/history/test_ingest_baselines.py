"""Runs the ingest job records from pull requests are kept, shown, and never a baseline.

Quarantine, duration estimates, flake rates and the monitor's failure streaks read trusted
runs only; a branch's own failures (failure-first order) still come from its own runs. Each
test stores trusted runs that say one thing and newer untrusted runs that say the opposite,
on a real SQLite store, so it fails when a reader stops filtering.
"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import write

from ci.history import queries
from ci.history.record import read_before
from ci.history.rows import AttemptRecord, RunRecord
from ci.history.store import open_store

NUM_GPUS = 0
X = "tests/e2e/test_x.py"
REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (Suite(name="megatron", tier="gpu", purpose="p", profile="e2e",
                    entries=(Entry(path="tests/e2e/test_x.py"),)),)
"""
E2E = """
    NUM_GPUS = 1

    if __name__ == "__main__":
        print("trained")
"""


def _run(n: int, outcome: str, *, trusted: bool, seconds: float = 10.0, branch: str = "main",
         commit: str = "") -> RunRecord:
    return RunRecord(uid=f"{n:032x}", suite="megatron", hardware="cuda", branch=branch,
                     commit=commit or f"c{n}", started_at=float(n), ended_at=float(n) + 1,
                     exit_code=0 if outcome in ("passed", "flaky") else 1,
                     trusted=trusted, pr=None if trusted else 7,
                     attempts=(AttemptRecord(entry_id=X, path=X, attempt=1, final=True, outcome=outcome,
                                             seconds=seconds, reason=f"{outcome} in run {n}"),))


def _store(tmp_path: Path, runs: list[RunRecord]) -> str:
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    with open_store(url) as store:
        for run in runs:
            store.record(run)
    return url


def _before(url: str, branch: str = "main"):  # type: ignore[no-untyped-def]
    return read_before(url, suite="megatron", hardware="cuda", branch=branch, quarantine_rate=0.2,
                       min_runs=5, warn=print)


def test_a_prs_passes_neither_lift_a_quarantine_nor_move_an_estimate(tmp_path: Path) -> None:
    trusted = [_run(i, "flaky" if i % 2 else "passed", trusted=True) for i in range(1, 11)]
    # Forty newer PR runs: all passing, all slow. Counted, they would bring the flake rate to
    # 10% (below 20%: quarantine lifted) and the p90 to 5000 s.
    pr = [_run(i, "passed", trusted=False, seconds=5000.0, branch="feature") for i in range(11, 51)]
    before = _before(_store(tmp_path, trusted + pr))
    assert before.quarantined == {X: "flake rate 50% (5 of 10 runs) is above 20%"}
    assert before.estimates == {X: 10.0}


def test_a_prs_failures_impose_no_quarantine_but_order_its_own_branch(tmp_path: Path) -> None:
    trusted = [_run(i, "passed", trusted=True) for i in range(1, 11)]
    # A PR fails the entry on commits where main passed it: counted, a 20 of 30 split rate.
    pr = [_run(i, "failed", trusted=False, branch="feature", commit=f"c{i - 20}") for i in range(21, 31)]
    url = _store(tmp_path, trusted + pr)
    assert _before(url).quarantined == {}
    # Its own failures still put the entry first on the PR's branch (an ordering hint only).
    assert _before(url, branch="feature").failed_here == frozenset({X})
    assert _before(url).failed_here == frozenset()


def _history(tmp_path: Path, url: str, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = queries.main([*args, "--history", url, "--root", str(tmp_path)])
    return code, capsys.readouterr().out


def test_the_monitor_sees_mains_streak_through_a_prs_fake_passes(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    trusted = [_run(1, "passed", trusted=True)] + [_run(i, "failed", trusted=True) for i in (2, 3, 4)]
    fake = [_run(i, "passed", trusted=False, branch="main") for i in (5, 6)]  # a PR's record says "main"
    url = _store(tmp_path, trusted + fake)
    write(tmp_path, {".slime-ci/suites.py": REGISTRY, X: E2E})  # the monitor judges registered entries
    code, out = _history(tmp_path, url, "monitor", "-k", "3", "--json", capsys=capsys)
    assert code == 1
    (streak,) = json.loads(out)
    assert (streak["entry_id"], streak["failures"], streak["last_passing_commit"]) == (X, 3, "c1")


def test_flake_rates_count_trusted_runs_and_show_lists_every_run(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    trusted = [_run(i, "passed", trusted=True) for i in range(1, 6)]
    pr = [_run(i, "flaky", trusted=False, branch="feature") for i in range(6, 11)]
    url = _store(tmp_path, trusted + pr)
    code, out = _history(tmp_path, url, "flaky", "--json", capsys=capsys)
    assert code == 0 and json.loads(out) == []
    code, out = _history(tmp_path, url, "show", capsys=capsys)
    assert code == 0 and out.count("untrusted (PR #7)") == 5 and "10 runs" in out


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
