"""The bisect's steps on the planted repository (tests/toolkit/_bisect_repo.py): commits tested
at once on disjoint sets of emulated GPUs under the GPU lock, as many as are free, and k
attempts per commit of a flaky entry whose rate rises from 0 to 40 %."""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from itertools import combinations
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
import _bisect_repo as planted
from _ci import REPO, run_ci
from _gitrepo import Clone

from ci.bisect.driver import commit_range, junit_outcome
from ci.gpu.allocator import hold
from ci.history.rows import AttemptRecord, RunRecord
from ci.history.store import open_store
from ci.proc import alive, wait_until

NUM_GPUS = 0
PAIR = "tests/gpu/test_pair.py"
FLAKY = "tests/unit/test_flaky.py"


@pytest.fixture(scope="module")
def planted_repo(tmp_path_factory):
    return planted.build(tmp_path_factory.mktemp("planted"), gpu_sleep=0.3)


def test_free_gpu_sets_are_tested_at_once_each_under_the_lock(planted_repo, tmp_path):
    """8 emulated GPUs, a 2-GPU entry: 4 commits per round, 2 rounds for 32 commits (binary
    takes 6), and steps that ran at the same time held disjoint GPUs."""
    clone, shas = planted_repo
    probe = tmp_path / "probe"
    probe.mkdir()
    proc = run_ci("bisect", "--suite", "gpu", "--entry", PAIR, "--good", shas[0], "--bad", shas[32],
                  "--emulate-gpus", "--history", "off", "--root", str(clone.root),
                  "--run-arg=--no-prefork", env={"SLIME_CI_PROBE_DIR": str(probe)}, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 at once (4 free set(s) of 2 GPU(s) of 8 (emulated))" in proc.stdout
    assert f"first bad commit: {shas[planted.BREAK][:10]}" in proc.stdout
    assert len(re.findall(r"^round \d+: testing 4 commit", proc.stdout, re.M)) == 2, proc.stdout
    held = []
    for f in probe.iterdir():
        gpus, began, ended = f.read_text().split()
        held.append((set(gpus.split(",")), float(began), float(ended)))
    assert len(held) == 8 and all(len(g) == 2 for g, _, _ in held)
    overlapping = [(a, b) for a, b in combinations(held, 2) if a[1] < b[2] and b[1] < a[2]]
    assert overlapping, "no two steps ran at the same time"
    assert all(not (a[0] & b[0]) for a, b in overlapping), overlapping


def test_gpus_held_by_others_narrow_the_round(planted_repo, tmp_path):
    """With 4 of the 8 GPUs held by another job, 2 sets of 2 are free: 2 commits per round."""
    clone, shas = planted_repo
    pattern = str(tmp_path / "gpu_{gpu_id}.lock")
    with hold(count=4, total_gpus=8, lock_path_pattern=pattern, command="another job"):
        proc = run_ci("bisect", "--suite", "gpu", "--entry", PAIR, "--good", shas[0], "--bad", shas[32],
                      "--emulate-gpus", "--lock-path-pattern", pattern, "--dry-run",
                      "--root", str(clone.root))
    assert proc.returncode == 0, proc.stderr
    assert "2 at once (2 free set(s) of 2 GPU(s) of 8 (emulated)); at most 6 round(s)" in proc.stdout
    assert f"--lock-path-pattern '{pattern}'" in proc.stdout  # the steps queue on the same lock


def test_a_rate_rising_from_0_to_40_percent_is_named_as_such(planted_repo, tmp_path):
    """The history says the entry flakes 2 runs in 5: k = 5 attempts at 90 %. Commit 11 raised
    its failure rate from 0 to 40 %; the bisect says so instead of naming a culprit. Each
    attempt's draw is seeded by the commit and SLIME_CI_BISECT_ATTEMPT (see _bisect_repo.py)."""
    clone, shas = planted_repo
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    with open_store(url) as store:
        for n, outcome in enumerate(("passed", "flaky", "passed", "flaky", "passed")):
            store.record(RunRecord(uid=f"r{n}", suite="unit", commit=shas[20 + n], branch="main",
                                   started_at=n, ended_at=n + 1, exit_code=0, attempts=(
                AttemptRecord(entry_id=FLAKY, path=FLAKY, attempt=1, final=True, outcome=outcome),)))
    proc = run_ci("bisect", "--suite", "unit", "--entry", FLAKY, "--good", shas[9], "--bad", shas[12],
                  "--confidence", "0.9", "--parallel", "4", "--history", url, "--root", str(clone.root),
                  "--run-arg=--no-prefork", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "flake rate 40%: 5 attempts per commit" in proc.stdout
    rise = shas[planted.RISE][:10]
    assert (f"flake rate rose at commit {rise} Share the cache between workers (#77) (CI Test, PR #77): "
            f"passed 5/5 at {shas[10][:10]}, failed 1 of 3 there") in proc.stdout, proc.stdout
    assert "first bad commit" not in proc.stdout
    assert clone.git("status", "--porcelain") == "" and len(clone.git("worktree", "list").splitlines()) == 1
    assert re.search(rf"{shas[9][:10]}\s+change 9 \(good end\)\s+passed 5/5", proc.stdout)
    assert len(re.findall(r"^round \d+:", proc.stdout, re.M)) == 1  # both ends and 2 probes at once


SLOW = """\
import os
import time
from pathlib import Path

NUM_GPUS = 0


def test_slow():
    Path(os.environ["SLIME_CI_PROBE_DIR"], "pid").write_text(str(os.getpid()))
    time.sleep(120)
"""


def test_ctrl_c_stops_the_step_removes_the_worktrees_and_exits_130(tmp_path):
    clone = Clone(tmp_path)
    good = clone.commit("good", {".slime-ci/suites.py": planted.REGISTRY, "tests/unit/test_slow.py": SLOW})
    bad = [clone.commit(f"change {i}") for i in range(3)][-1]
    probe = tmp_path / "probe"
    probe.mkdir()
    before = clone.git("worktree", "list")
    temps = set(Path(tempfile.gettempdir()).glob("slime-ci-bisect-*"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ci", "bisect", "--suite", "unit", "--entry", "tests/unit/test_slow.py",
         "--good", good, "--bad", bad, "--history", "off", "--root", str(clone.root), "--run-arg=--no-prefork"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "SLIME_CI_PROBE_DIR": str(probe)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (probe / "pid").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert (probe / "pid").exists(), proc.communicate(timeout=30)
    step_pid = int((probe / "pid").read_text())
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert err.strip().splitlines()[-1] == "interrupted"
    assert wait_until(lambda: not alive(step_pid), 30), "the step's test process outlived the bisect"
    assert clone.git("worktree", "list") == before
    assert set(Path(tempfile.gettempdir()).glob("slime-ci-bisect-*")) == temps, "its worktrees' folder is left"


def test_the_range_follows_first_parents_and_reads_pr_numbers(planted_repo):
    clone, shas = planted_repo
    commits = commit_range(clone.root, shas[18], shas[21])
    assert [c.sha for c in commits] == shas[18:22]
    assert [c.pr for c in commits] == [None, None, 120, None]


def test_junit_outcome_reads_only_the_entry_asked_for(tmp_path):
    path = tmp_path / "j.xml"
    path.write_text('<testsuites><testsuite name="a.py" failures="0" errors="0"/>'
                    '<testsuite name="b.py" failures="1" errors="0"/></testsuites>')
    assert junit_outcome(path, "a.py") == "passed"
    assert junit_outcome(path, "b.py") == "failed"
    assert junit_outcome(path, "c.py") is None
    assert junit_outcome(tmp_path / "missing.xml", "a.py") is None


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
