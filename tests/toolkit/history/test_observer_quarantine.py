"""The registry's default auto-quarantine, through a real `python -m ci run` on a planted history.

A real SQLite store holds ten earlier runs of a small emulated-GPU suite that sets no rate of
its own: one entry flaked in 2 of 10 (one pass on a retry, one failure on a commit where it
also passed), one in 1 of 10, one in 3 of only 9. Then every entry fails for real. Only the
first is above the default (more than 1 in 10, over at least 10 runs), so only it is held.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci, write

from ci.history.rows import AttemptRecord, RunRecord
from ci.history.store import open_store
from ci.registry import AUTO_QUARANTINE_MIN_RUNS, AUTO_QUARANTINE_RATE, Suite

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Suite

    ENTRIES = (Entry(path="tests/e2e/test_held.py"), Entry(path="tests/e2e/test_kept.py"),
               Entry(path="tests/e2e/test_young.py"))
    SUITES = (
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", timeout=60, entries=ENTRIES),
        Suite(name="strict", tier="gpu", purpose="p", profile="e2e", timeout=60, entries=ENTRIES,
              quarantine_rate=None),
    )
"""
BROKEN = """
    NUM_GPUS = 1

    def execute():
        raise SystemExit("broken for real")

    if __name__ == "__main__":
        execute()
"""
HELD, KEPT, YOUNG = (f"tests/e2e/test_{n}.py" for n in ("held", "kept", "young"))


def _history(suite: str) -> list[RunRecord]:
    """Ten runs, oldest first; run 7 re-runs run 6's commit, where test_held had failed."""
    runs = []
    for n in range(10):
        outcome = {HELD: "flaky" if n == 2 else "failed" if n == 6 else "passed",
                   KEPT: "flaky" if n == 4 else "passed",
                   YOUNG: "flaky" if n in (1, 3, 5) else "passed"}
        attempts = tuple(AttemptRecord(entry_id=p, path=p, attempt=1, final=True, outcome=o, seconds=1.0)
                         for p, o in outcome.items() if not (p == YOUNG and n == 0))
        runs.append(RunRecord(uid=f"{suite}-{n}", suite=suite, commit=f"c{6 if n == 7 else n}",
                              branch="main", hardware="emulated", started_at=float(n),
                              ended_at=n + 0.5, exit_code=0, attempts=attempts))
    return runs


@pytest.fixture
def repo(tmp_path):
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY, HELD: BROKEN, KEPT: BROKEN, YOUNG: BROKEN})
    url = f"sqlite:///{root / '.ci-cache/history.sqlite'}"
    with open_store(url) as store:
        for suite in ("train", "strict"):
            for run in _history(suite):
                store.record(run)
    return root, url


def _run(repo, suite):
    root, url = repo
    proc = run_ci("run", "--suite", suite, "--root", str(root), "--emulate-gpus", "--gpus", "2",
                  "--history", url, "--order", "longest")
    rows = {x.split()[0]: x.split()[1] for x in proc.stdout.splitlines() if x.startswith("tests/e2e/")}
    return proc, rows


def test_the_registry_default_is_more_than_one_flake_in_ten_over_ten_runs():
    assert (AUTO_QUARANTINE_RATE, AUTO_QUARANTINE_MIN_RUNS) == (0.1, 10)
    suite = Suite(name="s", tier="cpu", purpose="p", profile="cpu")
    assert (suite.quarantine_rate, suite.quarantine_min_runs) == (0.1, 10)


def test_above_the_default_rate_is_quarantined_at_it_or_too_young_is_not(repo):
    proc, rows = _run(repo, "train")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the two not held still fail the job
    assert rows == {HELD: "QUARANTINED", KEPT: "failed", YOUNG: "failed"}, proc.stdout
    assert ("QUARANTINED (flake rate 20% (2 of 10 runs) is above 10%); it failed") in proc.stdout


def test_a_suite_that_opts_out_holds_nothing(repo):
    proc, rows = _run(repo, "strict")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert rows == {HELD: "failed", KEPT: "failed", YOUNG: "failed"}, proc.stdout


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
