"""GPU suites on a Ray cluster across separate hosts, each a network namespace, with faults mid-matrix.

The hosts (`_netns_hosts.py`): a head (the driver runs there, as a CI runner on the head
would) and three workers with 4 logical GPUs each, each its own network namespace on a
private bridge, its own address, hostname and /dev/shm (so its own GPU lock files).
Entries run through the real CLI (`python -m ci run --ray-address …`). The faults are
real: a link set down, a slow and lossy link, a raylet killed, the head cut off.
Needs root and iproute2; elsewhere every test skips and says why. Everything made is
removed at the end, also when a test fails.
"""

import fcntl
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, write
from _netns_hosts import SHM_DIR, netns_cluster, unavailable

NUM_GPUS = 0

WHY = unavailable()
# Slow: four Ray nodes to start (about 1-2 min on 2 busy cores), then 30-60 s per fault.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.skipif(bool(WHY), reason=f"no namespace hosts: {WHY}")]

REGISTRY = """
    from ci.registry import Entry, Suite

    def job(tag, gpus, seconds, lines=5):
        return Entry(path=f"tests/e2e/test_g{gpus}.py",
                     test_args=("--tag", tag, "--sleep", str(seconds), "--lines", str(lines)))

    SUITES = (
        Suite(name="spread", tier="gpu", purpose="p", profile="e2e", timeout=300, entries=(
            job("a4", 4, 2, 40), job("b4", 4, 2, 40), job("c2", 2, 2, 40), job("d2", 2, 2, 40),
            job("e1", 1, 1, 40), job("f1", 1, 1, 40),
        )),
        Suite(name="long", tier="gpu", purpose="p", profile="e2e", timeout=300, entries=(
            job("l1", 4, 14), job("l2", 4, 14),
        )),
        Suite(name="mixed", tier="gpu", purpose="p", profile="e2e", timeout=300, entries=(
            job("m1", 4, 60), job("m2", 4, 60), job("q1", 2, 0.5), job("q2", 2, 0.5),
        )),
    )
"""

# Records where it ran (the host, its GPUs) and when; prints numbered lines for the output check.
ENTRY = """
    import json, os, socket, sys, time
    NUM_GPUS = {n}

    def arg(name):
        return sys.argv[sys.argv.index(name) + 1]

    def note(**fields):
        with open(os.environ["SLIME_TEST_RECORD"], "a") as fh:
            fh.write(json.dumps(fields) + "\\n")

    def execute(tag, seconds, lines):
        note(tag=tag, event="start", pid=os.getpid(), host=socket.gethostname(),
             gpus=os.environ.get("SLIME_CI_GPUS", ""), at=time.time())
        for i in range(lines):
            print(f"{{tag}} line {{i}} of {{lines}}", flush=True)
            time.sleep(seconds / max(lines, 1))
        note(tag=tag, event="end", pid=os.getpid(), host=socket.gethostname(),
             gpus=os.environ.get("SLIME_CI_GPUS", ""), at=time.time())

    if __name__ == "__main__":
        execute(arg("--tag"), float(arg("--sleep")), int(arg("--lines")))
"""


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through the fixture's clean-up


@pytest.fixture(scope="module")
def hosts():
    c = netns_cluster()
    previous = signal.signal(signal.SIGTERM, _interrupted)  # SIGINT already raises KeyboardInterrupt
    try:
        c.start(workers=3, gpus=4, cpus=2)
        yield c
    finally:
        signal.signal(signal.SIGTERM, previous)
        c.stop()
        left, nets = c.group_members(), c.leftovers()
        assert left == [] and nets == [], f"outlived the test hosts: processes {left}, namespaces {nets}"


@pytest.fixture
def cluster(hosts):
    """The module's hosts, made whole before each test (a fault test leaves them broken, and
    the last one's are only removed): links up and unshaped, every node back."""
    for h in hosts.hosts:
        hosts.unshape(h)
        hosts.mend(h)
    alive = set(hosts.alive_hosts())
    for h in hosts.hosts:
        if h.hostname not in alive or (h.proc is not None and h.proc.poll() is not None):
            hosts.restart(h)
    return hosts


@pytest.fixture
def checkout(tmp_path):
    return write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY,
                                     **{f"tests/e2e/test_g{n}.py": ENTRY.format(n=n) for n in (1, 2, 4)}})


def _driver(cluster, checkout, tmp_path, suite, unreachable=30):
    """`python -m ci run` on the head's host, in the background."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLIME_TEST_RECORD": str(tmp_path / "record.jsonl"),
           "SLIME_CI_RAY_UNREACHABLE_S": str(unreachable), "PYTHONFAULTHANDLER": "1"}
    argv = [sys.executable, "-m", "ci", "run", "--suite", suite, "--root", str(checkout), "--emulate-gpus",
            "--ray-address", cluster.address, "--lock-path-pattern", f"{SHM_DIR}/gpu_{{gpu_id}}.lock"]
    return subprocess.Popen(cluster.in_host(cluster.head, argv), cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _finish(proc, timeout=300):
    """The driver's output; a driver still running after `timeout` dumps its threads and is killed."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGABRT)  # PYTHONFAULTHANDLER: every thread's stack to stderr
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the driver hung:\n{out[-3000:]}\n{err[-6000:]}") from None


def _records(tmp_path, event=None):
    path = tmp_path / "record.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [r for r in rows if event is None or r["event"] == event]


def _wait_started(tmp_path, proc, tags, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        started = {r["tag"]: r for r in _records(tmp_path, "start")}
        if set(tags) <= set(started):
            return started
        time.sleep(0.2)
    raise AssertionError(f"{tags} did not all start: {_records(tmp_path)} (driver exit {proc.poll()})")


def _alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _held_locks(cluster, host):
    """GPU lock files on `host` that someone holds (a non-blocking flock fails)."""
    held = []
    for path in sorted(host.locks().glob("gpu_*.lock")):
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            held.append(path.name)
        finally:
            os.close(fd)
    return held


def _no_overlap_on_one_gpu(tmp_path):
    """No two runs of any entries overlapped in time on the same host's same GPU."""
    starts = _records(tmp_path, "start")
    ends = {(r["pid"], r["host"]): r["at"] for r in _records(tmp_path, "end")}
    spans = [(r["host"], set(r["gpus"].split(",")) - {""}, r["at"], ends.get((r["pid"], r["host"]), 1e18), r["tag"])
             for r in starts]
    for i, (h1, g1, s1, e1, t1) in enumerate(spans):
        for h2, g2, s2, e2, t2 in spans[i + 1:]:
            assert not (h1 == h2 and g1 & g2 and s1 < e2 and s2 < e1), f"{t1} and {t2} shared GPUs {g1 & g2} on {h1}"


class _Bars(HTMLParser):
    """The timeline's bars as (row, outcome); a row is named host:gpu."""

    def __init__(self):
        super().__init__()
        self.bars, self.rows, self._row = [], [], ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "g" and a.get("class") == "row":
            self._row = a["data-row"]
            self.rows.append(self._row)
        elif tag == "rect" and a.get("class") == "bar":
            self.bars.append((self._row, a.get("data-outcome")))


def _timeline(out):
    page = Path([line for line in out.splitlines() if line.startswith("timeline: ")][-1].removeprefix("timeline: "))
    parser = _Bars()
    parser.feed(page.read_text())
    return parser


def test_a_suite_runs_across_three_hosts_each_with_its_own_locks(cluster, checkout, tmp_path):
    proc = _driver(cluster, checkout, tmp_path, "spread")
    out, err = _finish(proc)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert "spread: 6 passed, 0 failed, 0 skipped" in out.splitlines()
    starts = _records(tmp_path, "start")
    used = {r["host"] for r in starts}
    workers = {h.hostname for h in cluster.workers}
    assert used <= workers and len(used) >= 2, used  # 14 GPUs of entries at once need two hosts or more
    rows = _timeline(out).rows
    for host in used:
        assert f"{host}:0" in rows, (host, rows)  # the timeline names each host's GPUs
    # Each host's lock files are its own: in its /dev/shm, none on a host no entry used.
    for h in cluster.workers:
        if h.hostname in used:
            assert list(h.locks().glob("gpu_*.lock")), h.hostname
        assert _held_locks(cluster, h) == []
    assert not list(cluster.head.locks().glob("gpu_*.lock"))


def test_a_link_cut_mid_entry_is_lost_on_that_host_and_rerun_on_another(cluster, checkout, tmp_path):
    proc = _driver(cluster, checkout, tmp_path, "long", unreachable=6)
    first = _wait_started(tmp_path, proc, ["l1", "l2"])
    victim = next(h for h in cluster.workers if h.hostname == first["l1"]["host"])
    cluster.cut(victim)
    out, err = _finish(proc)
    assert proc.returncode == 0, out[-4000:] + err[-3000:]
    lost = [line for line in out.splitlines() if line.strip().startswith("LOST ")]
    assert len(lost) == 1 and f"node {victim.hostname} lost mid-entry" in lost[0], out[-3000:]
    flaky = [line for line in out.splitlines() if line.startswith("flaky: ")]
    assert len(flaky) == 1 and victim.hostname in flaky[0] and "--tag l1 " in flaky[0], out[-3000:]
    assert "long: 2 passed, 0 failed, 0 skipped" in out.splitlines()
    reruns = [r for r in _records(tmp_path, "start") if r["tag"] == "l1"]
    assert len(reruns) == 2 and reruns[1]["host"] != victim.hostname, reruns
    _no_overlap_on_one_gpu(tmp_path)
    lost_rows = {row for row, outcome in _timeline(out).bars if outcome == "lost"}
    assert lost_rows and all(row.startswith(f"{victim.hostname}:") for row in lost_rows), lost_rows
    # Cut off from the head, the host stopped its copy of the entry and freed its GPUs.
    assert not _alive(first["l1"]["pid"])
    assert not any(r["tag"] == "l1" and r["host"] == victim.hostname for r in _records(tmp_path, "end"))
    assert _held_locks(cluster, victim) == []


@pytest.mark.skipif(shutil.which("iptables") is None, reason="the lossy link needs iptables")
def test_a_slow_lossy_link_still_gives_every_line_in_order(cluster, checkout, tmp_path):
    how = [cluster.shape(h) for h in cluster.workers]
    proc = _driver(cluster, checkout, tmp_path, "spread")
    out, err = _finish(proc)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    for tag in ("a4", "b4", "c2", "d2", "e1", "f1"):
        got = [line.split("] ", 1)[1] for line in out.splitlines()
               if line.startswith("[tests/e2e/") and f"--tag {tag} " in line and f"{tag} line " in line]
        assert got == [f"{tag} line {i} of 40" for i in range(40)], (tag, got[:5], len(got))
    span = [line for line in out.splitlines() if " entries in " in line and "JUnit" in line]
    assert span, out[-2000:]
    print(f"slow link ({how[0]}): {span[0]}")


def test_a_raylet_killed_under_its_entries_frees_its_gpus_and_they_rerun(cluster, checkout, tmp_path):
    proc = _driver(cluster, checkout, tmp_path, "long")
    first = _wait_started(tmp_path, proc, ["l1", "l2"])
    victim = next(h for h in cluster.workers if h.hostname == first["l1"]["host"])
    assert _held_locks(cluster, victim) != []  # the entry holds its GPUs there
    cluster.kill_raylet(victim)
    # The entry (14 s of sleep) dies with its node, and with it its hold on the host's GPUs.
    deadline = time.monotonic() + 10
    while _alive(first["l1"]["pid"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(first["l1"]["pid"]), "the entry outlived its node's raylet"
    # The process that holds the host's locks for it (the node's worker) follows within
    # seconds; on a loaded host the entry can be seen gone a moment before it.
    deadline = time.monotonic() + 20
    while _held_locks(cluster, victim) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _held_locks(cluster, victim) == []
    out, err = _finish(proc)
    assert proc.returncode == 0, out[-4000:] + err[-3000:]
    assert any(line.strip().startswith("LOST ") and victim.hostname in line for line in out.splitlines()), out
    assert "long: 2 passed, 0 failed, 0 skipped" in out.splitlines()
    reruns = [r for r in _records(tmp_path, "start") if r["tag"] == "l1"]
    assert len(reruns) == 2, reruns
    _no_overlap_on_one_gpu(tmp_path)
    cluster.restart(victim)  # the host comes back: its GPUs are free, no lock of a dead holder
    assert _held_locks(cluster, victim) == []


def test_the_head_cut_off_ends_the_run_as_cluster_unreachable(cluster, checkout, tmp_path):
    proc = _driver(cluster, checkout, tmp_path, "mixed", unreachable=5)
    started = _wait_started(tmp_path, proc, ["m1", "m2", "q1", "q2"])
    deadline = time.monotonic() + 60
    while len(_records(tmp_path, "end")) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.5)  # the quick ones' results reach the driver
    cluster.cut(cluster.head)
    out, err = _finish(proc, timeout=120)
    assert proc.returncode == 5, out[-3000:] + err[-3000:]
    # The run ends in one line that says so (after its table on stdout).
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors == [err.splitlines()[-1]] and errors[0].startswith("error: cluster unreachable: "), err
    # Every result gathered so far is in the history.
    db = sqlite3.connect(checkout / ".ci-cache" / "history.sqlite")
    rows = db.execute("select entry_id, outcome from attempts").fetchall()
    outcomes = {e.split("--tag ")[1].split()[0]: o for e, o in rows}
    assert outcomes.get("q1") == "passed" and outcomes.get("q2") == "passed", rows
    # Nothing of the run left running on the worker hosts, and their GPUs free.
    deadline = time.monotonic() + 30
    while any(_alive(started[t]["pid"]) for t in ("m1", "m2")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(_alive(started[t]["pid"]) for t in ("m1", "m2"))
    for h in cluster.workers:
        assert _held_locks(cluster, h) == [], h.hostname


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
