"""Durations from history (p90 on the same hardware) and the failure-first order on a branch."""

import re
import sys

import pytest
from _ci import run_ci, write
from _gitrepo import git

from ci.history.records import AttemptRecord, RunRecord
from ci.history.stats import estimates, failed_on_branch, percentile
from ci.history.store import AttemptRow, open_store
from ci.plan import PlannedEntry, failure_first, longest_first

NUM_GPUS = 0


def _row(entry, seconds, outcome="passed", branch="main", n=0):
    return AttemptRow(run_uid=f"r{n}", suite="s", commit="c", branch=branch, event="push", hardware="cpu",
                      started_at=float(n), entry_id=entry, path=entry, attempt=1, final=True,
                      outcome=outcome, seconds=seconds, reason="", num_gpus=0)


def test_the_estimate_is_the_p90_of_the_last_15_passing_runs():
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9) == pytest.approx(9.1)
    old = [_row("a", 100.0, n=n) for n in range(5)]  # long ago, slower: out of the window
    recent = [_row("a", float(s), n=5 + i) for i, s in enumerate([10] * 13 + [30, 11])]
    failed = [_row("a", 500.0, outcome="failed", n=30)]  # a failure's seconds say nothing
    est = estimates(old + recent + failed)
    assert est["a"] == pytest.approx(percentile([10] * 13 + [30, 11], 0.9))
    assert 10 < est["a"] < 30  # one slow outlier does not set it, one fast run does not either


def test_failure_first_orders_failed_then_changed_then_longest():
    def e(name):
        return PlannedEntry(id=name, path=name, timeout=100, num_gpus=0, kind="pytest")
    entries = [e("a"), e("b"), e("c"), e("d")]
    durations = {"a": 50.0, "b": 5.0, "c": 20.0, "d": 1.0}
    assert [x.id for x in longest_first(entries, durations)] == ["a", "c", "b", "d"]
    assert [x.id for x in failure_first(entries, durations, failed={"d"}, changed={"b"})] == [
        "d", "b", "a", "c"]
    rows = [_row("x", 1, "failed", "feat", 1), _row("x", 1, "passed", "feat", 2),
            _row("y", 1, "passed", "feat", 1), _row("y", 1, "failed", "feat", 2),
            _row("z", 1, "failed", "main", 3)]
    assert failed_on_branch(rows, "feat") == {"y"}


SCRIPT = "import time\nNUM_GPUS = 1\n\ndef execute():\n    time.sleep({s})\n\nif __name__ == '__main__':\n    execute()\n"
REGISTRY = """
    from ci.suites import Entry, Suite

    SUITES = (
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", entries=(
            Entry(path="tests/e2e/test_long.py"), Entry(path="tests/e2e/test_mid.py"),
            Entry(path="tests/e2e/test_short.py"), Entry(path="tests/e2e/test_flop.py"),
        )),
    )
"""


def test_on_a_branch_the_failed_then_the_changed_entry_run_first(tmp_path):
    root = write(tmp_path / "repo", {"ci/suites.py": REGISTRY,
                                     "tests/e2e/test_long.py": SCRIPT.format(s=0.3),
                                     "tests/e2e/test_mid.py": SCRIPT.format(s=0.2),
                                     "tests/e2e/test_short.py": SCRIPT.format(s=0.1),
                                     "tests/e2e/test_flop.py": SCRIPT.format(s=0)})
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-qm", "base")
    git(root, "checkout", "-qb", "feature")
    (root / "tests/e2e/test_short.py").write_text(SCRIPT.format(s=0.15))
    git(root, "commit", "-qam", "touch short")
    url = f"sqlite:///{root / '.ci-cache/history.sqlite'}"
    with open_store(url) as store:  # last time on this branch test_flop failed
        store.record(RunRecord(uid="before", suite="train", branch="feature", hardware="emulated",
                               started_at=1.0, ended_at=2.0, exit_code=1, attempts=tuple(
            AttemptRecord(entry_id=p, path=p, attempt=1, final=True, outcome=o, seconds=s)
            for p, o, s in [("tests/e2e/test_long.py", "passed", 30.0), ("tests/e2e/test_mid.py", "passed", 20.0),
                            ("tests/e2e/test_short.py", "passed", 10.0), ("tests/e2e/test_flop.py", "failed", 1.0)])))

    def order(*extra):
        proc = run_ci("run", "--suite", "train", "--root", str(root), "--emulate-gpus", "--gpus", "2",
                      "--dry-run", "--history", url, "--base", "main", *extra)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return [m.group(1) for m in re.finditer(r"^  (tests/\S+)  gpus=", proc.stdout, re.M)]

    assert order() == ["tests/e2e/test_flop.py", "tests/e2e/test_short.py", "tests/e2e/test_long.py",
                       "tests/e2e/test_mid.py"]
    # Longest first from the history's p90s; test_flop never passed, so it has no estimate and
    # the planner's guess for an unknown entry (twice the median) puts it early.
    longest = ["tests/e2e/test_flop.py", "tests/e2e/test_long.py", "tests/e2e/test_mid.py",
               "tests/e2e/test_short.py"]
    assert order("--order", "longest") == longest
    git(root, "checkout", "-q", "main")  # on main: longest first
    assert order() == longest


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
