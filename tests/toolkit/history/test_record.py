"""Durations from history (p90 on the same hardware) and the failure-first order on a branch."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci, write
from _gitrepo import git

from ci.history.rows import AttemptRecord, RunRecord
from ci.history.stats import estimates, failed_on_branch, percentile
from ci.history.store import AttemptRow, open_store
from ci.select.entries import ResolvedEntry, failure_first, longest_first

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
    # Never passed: its failed runs' seconds, not the planner's guess; a timeout never counts.
    never = [_row("b", 90.0, outcome="failed", n=1), _row("b", 100.0, outcome="failed", n=2),
             _row("b", 300.0, outcome="timeout", n=3), _row("c", 300.0, outcome="timeout", n=4)]
    est = estimates(old + never)
    assert est["b"] == pytest.approx(99.0) and "c" not in est and est["a"] == 100.0


def test_failure_first_orders_failed_then_nearest_shortest_then_longest():
    def e(name):
        return ResolvedEntry(id=name, path=name, timeout=100, num_gpus=0, kind="pytest")
    entries = [e("a"), e("b"), e("c"), e("d"), e("far"), e("near_slow"), e("near_fast")]
    durations = {"a": 50.0, "b": 5.0, "c": 20.0, "d": 1.0, "far": 0.5, "near_slow": 40.0, "near_fast": 3.0}
    assert [x.id for x in longest_first(entries, durations)] == [
        "a", "near_slow", "c", "b", "near_fast", "d", "far"]
    # The failed entry, the edited test (0), direct importers shortest first (1), the one two
    # imports away (2) however short, then the untouched longest first.
    order = failure_first(entries, durations, failed={"d"},
                          changed={"b": 0, "near_slow": 1, "near_fast": 1, "far": 2})
    assert [x.id for x in order] == ["d", "b", "near_fast", "near_slow", "far", "a", "c"]
    rows = [_row("x", 1, "failed", "feat", 1), _row("x", 1, "passed", "feat", 2),
            _row("y", 1, "passed", "feat", 1), _row("y", 1, "failed", "feat", 2),
            _row("z", 1, "failed", "main", 3)]
    assert failed_on_branch(rows, "feat") == {"y"}


# A package and tests that import it at known distances from slime/core.py, the module the
# branch changes: the order must come from the import graph git and the parser see.
GRAPH = {
    "slime/__init__.py": "",
    "slime/core.py": "def value():\n    return 1\n",
    "slime/mid.py": "from slime.core import value\n\ndef twice():\n    return 2 * value()\n",
    "slime/other.py": "def unrelated():\n    return 0\n",
}
IMPORTS = {  # test file -> (what it imports, p90 seconds in the history)
    "tests/e2e/test_direct_slow.py": ("from slime.core import value", 30.0),
    "tests/e2e/test_direct_fast.py": ("import slime.core", 5.0),
    "tests/e2e/test_via_mid.py": ("from slime.mid import twice", 1.0),
    "tests/e2e/test_edited.py": ("from slime.other import unrelated", 50.0),
    "tests/e2e/test_far_long.py": ("from slime.other import unrelated", 100.0),
    "tests/e2e/test_far_mid.py": ("from slime.other import unrelated", 10.0),
    "tests/e2e/test_failed.py": ("from slime.other import unrelated", 60.0),
}
GRAPH_REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", entries=(
{entries}
        )),
    )
"""


def test_on_a_branch_the_import_distance_then_the_shortest_decides(tmp_path):
    registry = GRAPH_REGISTRY.format(entries="\n".join(f'            Entry(path="{p}"),' for p in IMPORTS))
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry, **GRAPH, **{
        p: f"{imp}\nNUM_GPUS = 1\n\ndef execute():\n    pass\n\nif __name__ == '__main__':\n    execute()\n"
        for p, (imp, _s) in IMPORTS.items()}})
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-qm", "base")
    git(root, "checkout", "-qb", "feature")
    (root / "slime/core.py").write_text("def value():\n    return 2\n")
    with (root / "tests/e2e/test_edited.py").open("a") as f:
        f.write("# edited on the branch\n")
    git(root, "commit", "-qam", "change core, edit one test")
    url = f"sqlite:///{root / '.ci-cache/history.sqlite'}"
    with open_store(url) as store:
        store.record(RunRecord(uid="before", suite="train", branch="feature", hardware="emulated",
                               started_at=1.0, ended_at=2.0, exit_code=1, attempts=tuple(
            AttemptRecord(entry_id=p, path=p, attempt=1, final=True, seconds=s,
                          outcome="failed" if p.endswith("test_failed.py") else "passed")
            for p, (_imp, s) in IMPORTS.items())))
        # Two more passing runs, so each passing entry's p90 is the seconds above.
        for n in (2, 3):
            store.record(RunRecord(uid=f"r{n}", suite="train", branch="main", hardware="emulated",
                                   started_at=float(n), ended_at=n + 0.5, exit_code=0, attempts=tuple(
                AttemptRecord(entry_id=p, path=p, attempt=1, final=True, outcome="passed", seconds=s)
                for p, (_imp, s) in IMPORTS.items() if not p.endswith("test_failed.py"))))
    proc = run_ci("run", "--suite", "train", "--root", str(root), "--emulate-gpus", "--gpus", "2",
                  "--dry-run", "--history", url, "--base", "main")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    order = [m.group(1).removeprefix("tests/e2e/") for m in re.finditer(r"^  (tests/\S+)  gpus=", proc.stdout, re.M)]
    assert order == [
        "test_failed.py",  # failed on this branch last time
        "test_edited.py",  # the diff edits it (distance 0), though it is long
        "test_direct_fast.py", "test_direct_slow.py",  # import slime.core: shortest first
        "test_via_mid.py",  # two imports away, though the shortest of all
        "test_far_long.py", "test_far_mid.py",  # not reached by the diff: longest first
    ]


SCRIPT = "import time\nNUM_GPUS = 1\n\ndef execute():\n    time.sleep({s})\n\nif __name__ == '__main__':\n    execute()\n"
REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", entries=(
            Entry(path="tests/e2e/test_long.py"), Entry(path="tests/e2e/test_mid.py"),
            Entry(path="tests/e2e/test_short.py"), Entry(path="tests/e2e/test_flop.py"),
        )),
    )
"""


def test_on_a_branch_the_failed_then_the_changed_entry_run_first(tmp_path):
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY,
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
    # Longest first from the history's p90s; test_flop never passed, so its estimate is the
    # second its failed run took, and it goes last.
    longest = ["tests/e2e/test_long.py", "tests/e2e/test_mid.py", "tests/e2e/test_short.py",
               "tests/e2e/test_flop.py"]
    assert order("--order", "longest") == longest
    git(root, "checkout", "-q", "main")  # on main: longest first
    assert order() == longest


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
