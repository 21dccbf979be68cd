"""`python -m ci smoke`: a smoke's suites run at once, real `ci run` processes on one set of
emulated GPU locks, in a small checkout of their own."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, run_ci, write

from ci.registry.model import Smoke, SmokeRun
from ci.run.smoke import commands

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Smoke, SmokeRun, Suite

    SUITES = (
        Suite(name="alpha", tier="gpu", purpose="p", profile="e2e", timeout=120,
              entries=(Entry(path="tests/e2e/test_one.py"),)),
        Suite(name="beta", tier="gpu", purpose="p", profile="e2e", timeout=120,
              entries=(Entry(path="tests/e2e/test_two.py"), Entry(path="tests/e2e/test_fail.py"))),
        Suite(name="wide", tier="gpu", purpose="p", profile="e2e", timeout=120,
              entries=(Entry(path="tests/e2e/test_wide.py"),)),
    )
    SESSIONS = (
        Smoke(name="narrow", purpose="p", profiles=(), gpus=2, retries=0,
              runs=(SmokeRun(suite="alpha"), SmokeRun(suite="beta", only="tests/e2e/test_two.py"))),
        Smoke(name="full", purpose="p", profiles=(), gpus=2, retries=0,
              runs=(SmokeRun(suite="wide"), SmokeRun(suite="alpha"))),
        Smoke(name="broken", purpose="p", profiles=(), gpus=2, retries=0,
              runs=(SmokeRun(suite="alpha"), SmokeRun(suite="beta"))),
    )
"""

# Each entry writes when it started and ended, on which logical GPUs, then holds them.
HOLD = """
    import json, os, pathlib, time
    NUM_GPUS = {gpus}

    def execute():
        out = pathlib.Path(os.environ["MARKS"])
        name = "{name}"
        (out / (name + ".pid")).write_text(str(os.getpid()))
        start = time.time()
        time.sleep(float(os.environ.get("HOLD_S", "2")))
        {fail}
        (out / (name + ".json")).write_text(json.dumps(
            {{"start": start, "end": time.time(), "gpus": os.environ["SLIME_CI_GPUS"]}}))

    if __name__ == "__main__":
        execute()
"""


def _entry(name: str, gpus: int, fail: bool = False) -> str:
    return HOLD.format(name=name, gpus=gpus, fail="raise SystemExit('planted failure')" if fail else "")


@pytest.fixture
def repo(tmp_path):
    root = write(tmp_path / "repo", {
        "ci/registry/repo_suites.py": REGISTRY,
        "tests/e2e/test_one.py": _entry("one", 1),
        "tests/e2e/test_two.py": _entry("two", 1),
        "tests/e2e/test_fail.py": _entry("fail", 1, fail=True),
        "tests/e2e/test_wide.py": _entry("wide", 2),
    })
    marks = tmp_path / "marks"
    marks.mkdir()
    return root, marks


def _smoke(repo, name, *args, env=None, timeout=180):
    root, marks = repo
    return run_ci("smoke", name, "--root", str(root), "--history", "off", *args,
                  env={"MARKS": str(marks), **(env or {})}, timeout=timeout)


def _marks(marks: Path) -> dict:
    return {p.stem: json.loads(p.read_text()) for p in marks.glob("*.json")}


def test_each_run_is_a_ci_run_of_its_suite_on_the_shared_lock_files():
    smoke = Smoke(name="s", purpose="p", profiles=(), gpus=4, retries=1,
                  runs=(SmokeRun(suite="a"), SmokeRun(suite="b", only=("x", "y"))))
    got = commands(smoke, "/locks/gpu_{gpu_id}.lock", ["--history", "off"], python="py")
    assert [(c.suite, c.argv) for c in got] == [
        ("a", ("py", "-m", "ci", "run", "--suite", "a", "--emulate-gpus", "--gpus", "4", "--retries", "1",
               "--lock-path-pattern", "/locks/gpu_{gpu_id}.lock", "--history", "off")),
        ("b", ("py", "-m", "ci", "run", "--suite", "b", "--emulate-gpus", "--gpus", "4", "--retries", "1",
               "--lock-path-pattern", "/locks/gpu_{gpu_id}.lock", "--only", "x", "--only", "y",
               "--history", "off")),
    ]


def test_suites_run_at_once_on_disjoint_gpus_and_each_line_names_its_suite(repo):
    proc = _smoke(repo, "narrow", env={"HOLD_S": "3"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    marks = _marks(repo[1])
    assert set(marks) == {"one", "two"}  # beta's `only` left test_fail.py out
    one, two = marks["one"], marks["two"]
    assert one["start"] < two["end"] and two["start"] < one["end"], "the suites did not overlap"
    assert {one["gpus"], two["gpus"]} == {"0", "1"}, "two entries held the same logical GPU"
    lines = proc.stdout.splitlines()
    assert any(line.startswith("alpha | ") and "tests/e2e/test_one.py" in line for line in lines)
    assert any(line.startswith("beta  | ") and "tests/e2e/test_two.py" in line for line in lines)
    table = lines[lines.index("suite  exit  seconds"):]
    assert [row.split()[:2] for row in table[1:3]] == [["alpha", "0"], ["beta", "0"]]


def test_one_at_a_time_the_suites_do_not_overlap_and_a_failure_does_not_stop_the_next(repo):
    proc = _smoke(repo, "broken", "--one-at-a-time", env={"HOLD_S": "2"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 run(s) one at a time" in proc.stdout
    marks = _marks(repo[1])
    assert set(marks) == {"one", "two"}
    one, two = marks["one"], marks["two"]
    assert one["end"] <= two["start"], "beta started before alpha ended"
    table = proc.stdout.splitlines()
    table = table[table.index("suite  exit  seconds"):]
    assert [row.split()[:2] for row in table[1:3]] == [["alpha", "0"], ["beta", "1"]]


def test_an_entry_wanting_every_gpu_waits_for_the_other_suites_entries(repo):
    # Without the shared lock files each run would think both GPUs its own, and they would overlap.
    proc = _smoke(repo, "full", env={"HOLD_S": "2"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    marks = _marks(repo[1])
    wide, one = marks["wide"], marks["one"]
    assert wide["gpus"] == "0,1"
    assert wide["end"] <= one["start"] or one["end"] <= wide["start"], (wide, one)


def test_a_failing_suite_fails_the_smoke_with_its_status_and_the_others_still_finish(repo):
    proc = _smoke(repo, "broken", env={"HOLD_S": "1"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "broken: failed: beta (exit 1)" in proc.stderr
    assert set(_marks(repo[1])) == {"one", "two"}  # alpha's entry and beta's other one ran to the end


def test_an_unknown_smoke_is_one_line_and_exit_2(repo):
    proc = _smoke(repo, "nosuch")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: no smoke named 'nosuch' in the registry; smokes: broken, full, narrow"
    proc = _smoke(repo, "narrow", "--lock-path-pattern", "/tmp/x{gpu_id}")
    assert proc.returncode == 2 and "leave out --lock-path-pattern" in proc.stderr


def test_sigterm_stops_every_run_and_their_entries_and_exits_130(repo):
    root, marks = repo
    env = {**os.environ, "PYTHONPATH": str(REPO), "MARKS": str(marks), "HOLD_S": "120"}
    proc = subprocess.Popen([sys.executable, "-m", "ci", "smoke", "narrow", "--root", str(root),
                             "--history", "off"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 90
    while len(list(marks.glob("*.pid"))) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.2)
    pids = [int(p.read_text()) for p in marks.glob("*.pid")]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out[-3000:]
    assert _marks(marks) == {}, "an entry ran to its end"
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, *sys.argv[1:]]))
