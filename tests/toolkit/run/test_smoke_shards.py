"""`python -m ci smoke NAME --shard I/K`: a smoke's entries, all its runs' together, split by their
measured durations; each shard runs its own, together they run every entry exactly once, and a
shard with none is an error. Real `ci run` processes on emulated GPUs, in a planted checkout."""

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, run_ci, write

from ci.durations import baseline
from ci.errors import UsageError
from ci.registry.loader import load_registry
from ci.registry.model import Smoke
from ci.run.smoke import shard_runs
from ci.select.discover import discover
from ci.select.entries import smoke_entries

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Smoke, SmokeRun, Suite

    SUITES = (
        Suite(name="alpha", tier="gpu", purpose="p", profile="e2e", timeout=120,
              entries=(Entry(path="tests/e2e/test_one.py"),)),
        Suite(name="beta", tier="gpu", purpose="p", profile="e2e", timeout=120,
              entries=(Entry(path="tests/e2e/test_two.py"), Entry(path="tests/e2e/test_three.py"))),
        Suite(name="wide", tier="gpu", purpose="p", profile="e2e", timeout=120,
              entries=(Entry(path="tests/e2e/test_wide.py"),)),
    )
    SESSIONS = (
        Smoke(name="trio", purpose="p", profiles=(), gpus=2, retries=0, target_minutes=7,
              runs=(SmokeRun(suite="wide"), SmokeRun(suite="alpha"),
                    SmokeRun(suite="beta", only="tests/e2e/test_two.py"))),
    )
"""

ENTRY = """
    import os, pathlib
    NUM_GPUS = {gpus}

    def execute():
        (pathlib.Path(os.environ["MARKS"]) / "{name}-{{}}".format(os.getpid())).write_text("ran")

    if __name__ == "__main__":
        execute()
"""

# Measured seconds: the 2-GPU entry weighs 2 x 10, the two others 6 and 5.
DURATIONS = {"tests/e2e/test_wide.py": 10.0, "tests/e2e/test_one.py": 6.0, "tests/e2e/test_two.py": 5.0}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    files = {"ci/registry/repo_suites.py": REGISTRY,
             "tests/e2e/test_one.py": ENTRY.format(name="one", gpus=1),
             "tests/e2e/test_two.py": ENTRY.format(name="two", gpus=1),
             "tests/e2e/test_three.py": ENTRY.format(name="three", gpus=1),
             "tests/e2e/test_wide.py": ENTRY.format(name="wide", gpus=2)}
    root = write(tmp_path / "repo", files)
    (root / "tests" / "durations.json").write_text(json.dumps(DURATIONS), encoding="utf-8")
    return root


def _ran(marks: Path) -> list[str]:
    return sorted(p.name.split("-")[0] for p in marks.iterdir())


@pytest.mark.slow  # two smokes of real `ci run` processes
def test_each_shard_runs_its_entries_and_together_every_entry_once(repo: Path, tmp_path: Path) -> None:
    ran = {}
    for index in (1, 2):
        # Each shard from a checkout of its own, as each matrix job has: a shard's run records
        # its durations, and the next shard must split by the same ones as the first.
        root = shutil.copytree(repo, tmp_path / f"job-{index}")
        marks = tmp_path / f"marks-{index}"
        marks.mkdir()
        proc = run_ci("smoke", "trio", "--root", str(root), "--history", "off", "--shard", f"{index}/2",
                      env={"MARKS": str(marks)}, timeout=180)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        ran[index] = _ran(marks)
    # Split across the runs: shard 2 holds alpha's entry and beta's, and starts no `wide` run.
    assert ran == {1: ["wide"], 2: ["one", "two"]}
    assert "trio (shard 2/2: 2 entries): 2 run(s) at once on 2 emulated GPUs: alpha, beta" in proc.stdout


def test_a_shard_with_no_entry_is_one_line_and_exit_2(repo: Path) -> None:
    proc = run_ci("smoke", "trio", "--root", str(repo), "--history", "off", "--shard", "4/4", "--dry-run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == ("error: --shard 4/4 names no entry: the selection has 3; "
                                   "use at most 3 shards")
    proc = run_ci("smoke", "trio", "--root", str(repo), "--shard", "2of3", "--dry-run")
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --shard '2of3': expected I/K, e.g. 1/4"


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_the_gpu_smokes_shards_together_run_each_of_its_entries_once(count: int) -> None:
    registry = load_registry(REPO)
    smoke = next(s for s in registry.sessions if isinstance(s, Smoke) and s.name == "gpu_smoke")
    every = sorted((s, e.id) for s, e in smoke_entries(smoke, {s.name: s for s in registry.suites},
                                                        discover(REPO)))
    ran = []
    for index in range(1, count + 1):
        part = shard_runs(smoke, REPO, f"{index}/{count}")
        assert part.runs and all(r.patterns for r in part.runs)  # no run starts without an entry
        ran += [(r.suite, p) for r in part.runs for p in r.patterns]
    assert sorted(ran) == every and len(set(ran)) == len(ran)
    assert baseline(REPO)  # split by measured seconds, not by name
    with pytest.raises(UsageError, match="names no entry"):
        shard_runs(smoke, REPO, f"{len(every) + 1}/{len(every) + 1}")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
