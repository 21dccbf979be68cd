"""GPU suites on a real multi-node Ray cluster on this machine: a head and two workers.

The cluster is started with `ray start` on loopback (own ports, own temp dirs,
logical `--num-gpus`: this machine has no GPU) and every process it started is
stopped by process group at the end. Entries run through the real CLI
(`python -m ci run --ray-address …`) as they would from a CI job.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, run_ci, write
from _ray_cluster import local_cluster

NUM_GPUS = 0

pytestmark = pytest.mark.timeout(900)

REGISTRY = """
    from ci.registry import Entry, Suite

    def job(tag, gpus, seconds):
        return Entry(path=f"tests/e2e/test_g{gpus}.py", test_args=("--tag", tag, "--sleep", str(seconds)))

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
              exclude=("tests/e2e",)),
        Suite(name="spread", tier="gpu", purpose="p", profile="e2e", timeout=120, entries=(
            job("big1", 4, 3), job("big2", 4, 3), job("pair1", 2, 2), job("pair2", 2, 2),
            job("one", 1, 1), job("cfg", 0, 1),
        )),
        Suite(name="long", tier="gpu", purpose="p", profile="e2e", timeout=120, entries=(
            job("l1", 4, 12), job("l2", 4, 12),
        )),
    )
"""

# Records where it ran, which GPUs it was given, and whether its node's lock files for
# those GPUs were held for it while it ran.
ENTRY = """
    import fcntl, glob, json, os, sys, time
    NUM_GPUS = {n}

    def held_for_me(gpu):
        for path in glob.glob(os.path.join(os.environ["SLIME_TEST_LOCKS"], "*", f"gpu_{{gpu}}.lock")):
            record = open(path).read()
            fd = os.open(path, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except BlockingIOError:
                if os.environ["SLIME_CI_ENTRY"] in record:
                    return True
            finally:
                os.close(fd)
        return False

    def execute(tag, seconds):
        record = {{"tag": tag, "pid": os.getpid(), "start": time.time(),
                   "gpus": os.environ.get("SLIME_CI_GPUS"),
                   "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                   "cwd": os.getcwd(),
                   "locked": all(held_for_me(g) for g in os.environ["SLIME_CI_GPUS"].split(",") if g)}}
        with open(os.environ["SLIME_TEST_RECORD"], "a") as fh:
            fh.write(json.dumps(record) + "\\n")
        print(f"entry {{tag}} running", flush=True)
        time.sleep(seconds)
        print(f"entry {{tag}} done", flush=True)

    if __name__ == "__main__":
        execute(sys.argv[sys.argv.index("--tag") + 1], float(sys.argv[sys.argv.index("--sleep") + 1]))
"""


@pytest.fixture(scope="module")
def cluster():
    c = local_cluster()
    try:
        c.start(workers=2, gpus=4, cpus=2)
        yield c
    finally:
        c.stop()
        left = c.group_members()
        assert left == [], f"processes of the test cluster outlived it: {left}"


@pytest.fixture
def checkout(tmp_path):
    return write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY,
                                     **{f"tests/e2e/test_g{n}.py": ENTRY.format(n=n) for n in (0, 1, 2, 4)}})


def _env(tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir(exist_ok=True)
    return {"SLIME_TEST_RECORD": str(tmp_path / "record.jsonl"), "SLIME_TEST_LOCKS": str(locks)}


def _args(checkout, cluster, tmp_path, suite):
    return ("run", "--suite", suite, "--root", str(checkout), "--emulate-gpus",
            "--ray-address", cluster.address,
            "--lock-path-pattern", str(tmp_path / "locks" / "{node}" / "gpu_{gpu_id}.lock"))


def _records(tmp_path):
    path = tmp_path / "record.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


class _Rows(HTMLParser):
    """The timeline's bars, each with the row (node:gpu) it sits on."""

    def __init__(self):
        super().__init__()
        self.bars = []
        self.rows = []
        self._row = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "g" and a.get("class") == "row":
            self._row = a["data-row"]
            self.rows.append(self._row)
        elif tag == "rect" and a.get("class") == "bar":
            self.bars.append({**a, "row": self._row})


def _timeline(stdout):
    page = Path(stdout.splitlines()[-1].removeprefix("timeline: "))
    parser = _Rows()
    parser.feed(page.read_text())
    return parser, page


@contextlib.contextmanager
def _driver(checkout, cluster, tmp_path, suite):
    """`python -m ci run` in the background; killed (with its pipe closed) if the test fails."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **_env(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "ci", *_args(checkout, cluster, tmp_path, suite)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _wait_started(tmp_path, proc, count, timeout=300):
    deadline = time.monotonic() + timeout
    while len(_records(tmp_path)) < count and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    started = _records(tmp_path)
    assert len(started) == count, f"{len(started)} of {count} entries started (driver exit {proc.poll()})"
    return started


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_entries_spread_over_both_workers_on_their_own_gpus_under_node_locks(cluster, checkout, tmp_path):
    proc = run_ci(*_args(checkout, cluster, tmp_path, "spread"), env=_env(tmp_path), timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "spread: 6 passed, 0 failed, 0 skipped" in out.splitlines()
    # Output streams back live, each line prefixed with its entry.
    for tag in ("big1", "pair2", "cfg"):
        assert any(line.startswith("[tests/e2e/") and f"--tag {tag} " in line and line.endswith(
            f"entry {tag} running") for line in out.splitlines()), tag
    runs = {r["tag"]: r for r in _records(tmp_path)}
    assert set(runs) == {"big1", "big2", "pair1", "pair2", "one", "cfg"}
    for tag, r in runs.items():
        n = len(r["gpus"].split(",")) if r["gpus"] else 0
        assert n == {"big1": 4, "big2": 4, "pair1": 2, "pair2": 2, "one": 1, "cfg": 0}[tag]
        assert r["cwd"] == str(checkout)
        assert r["locked"], f"{tag}: its node's lock files for GPUs {r['gpus']} were not held for it"
    tl, page = _timeline(out)
    assert page.parent.parent == checkout / ".ci-cache" / "runs"
    # One row per GPU of each worker (4 + 4), named node:gpu, plus a CPU lane for the 0-GPU entry.
    gpu_rows = [r for r in tl.rows if r.rsplit(":", 1)[1].isdigit()]
    workers = sorted({r.rsplit(":", 1)[0] for r in gpu_rows})
    assert len(workers) == 2 and len(gpu_rows) == 8, tl.rows
    tags = {}
    for b in tl.bars:
        tags.setdefault(b["data-entry"].split("--tag ")[1].split()[0], set()).add(b["row"].rsplit(":", 1)[0])
    assert set(tags) == set(runs)
    # Each entry on one node; 13 GPUs of entries submitted at once on 2 x 4: both workers used.
    assert all(len(nodes) == 1 for nodes in tags.values()), tags
    assert {n for tag, nodes in tags.items() if tag != "cfg" for n in nodes} == set(workers), tags
    assert {b["row"].rsplit(":", 1)[1] for b in tl.bars if "--tag big1 " in b["data-entry"]} == \
        set(runs["big1"]["gpus"].split(","))
    junit = (checkout / ".ci-cache" / "junit" / "spread.xml").read_text()
    assert junit.count("<testsuite ") == 6


def test_ctrl_c_cancels_every_remote_entry(cluster, checkout, tmp_path):
    with _driver(checkout, cluster, tmp_path, "long") as proc:
        started = _wait_started(tmp_path, proc, 2)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted" in out
    deadline = time.monotonic() + 30
    while any(_alive(r["pid"]) for r in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(r["pid"]) for r in started), "a remote entry outlived Ctrl-C"
    assert "entry l1 done" not in out and "entry l2 done" not in out


def test_a_node_lost_mid_entry_is_reported_and_the_entry_retried_elsewhere(cluster, checkout, tmp_path):
    with _driver(checkout, cluster, tmp_path, "long") as proc:
        first = _wait_started(tmp_path, proc, 2)
        victim = cluster.workers[1]
        cluster.kill_node(victim)  # by pid: the worker's whole process group, as if the machine died
        out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-4000:]
    lost = [line for line in out.splitlines() if line.strip().startswith("LOST ")]
    assert len(lost) == 1, out[-3000:]
    assert "lost mid-entry; retrying it on another node" in lost[0]
    flaky = [line for line in out.splitlines() if line.startswith("flaky: ")]
    assert len(flaky) == 1 and "lost mid-entry; passed on " in flaky[0], out[-3000:]
    assert "long: 2 passed, 0 failed, 0 skipped" in out.splitlines()
    runs = _records(tmp_path)
    assert len(runs) == 3  # two first tries, one retry
    # The entry on the dead node did not keep running there.
    deadline = time.monotonic() + 30
    while any(_alive(r["pid"]) for r in first) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(r["pid"]) for r in first)
    tl, _ = _timeline(out)
    outcomes = sorted(b["data-outcome"] for b in tl.bars)
    assert outcomes.count("lost") == 4 and outcomes.count("flaky") == 4 and outcomes.count("passed") == 4


def test_bad_cluster_address_is_one_line_and_exit_2(checkout, tmp_path):
    proc = run_ci("run", "--suite", "spread", "--root", str(checkout), "--emulate-gpus",
                  "--ray-address", "127.0.0.1:1", timeout=180)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: cannot join the Ray cluster at 127.0.0.1:1")
    assert proc.stderr.count("\n") == 1



def test_a_bad_unreachable_window_is_one_line_and_exit_2(checkout):
    proc = run_ci("run", "--suite", "spread", "--root", str(checkout), "--emulate-gpus",
                  "--ray-address", "127.0.0.1:1", env={"SLIME_CI_RAY_UNREACHABLE_S": "soon"}, timeout=180)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == ("error: SLIME_CI_RAY_UNREACHABLE_S='soon' is not a number of seconds; "
                           "e.g. SLIME_CI_RAY_UNREACHABLE_S=120\n")

def test_a_cpu_suite_refuses_a_cluster(checkout):
    proc = run_ci("run", "--suite", "unit", "--root", str(checkout), env={"SLIME_CI_RAY_ADDRESS": "x:1"})
    assert proc.returncode == 2
    assert proc.stderr == "error: --ray-address runs GPU suites on a cluster; unit runs on this machine\n"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
