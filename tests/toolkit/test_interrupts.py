"""Interrupts and runner death: a signal is never lost, and entries never outlive their runner.

Processes are found by the pids and process groups the entries write down, never by name.
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _ci import REPO, code, write

from ci.proc import Groups, alive, group_members, start, stop_group, wait_exit

NUM_GPUS = 0

# Each entry notes its pid (= its process group: the runner starts it as a group leader)
# and starts a child in the same group, then sleeps far past any test's patience.
LONG = """
    import os, subprocess, sys, time, pytest
    NUM_GPUS = 0
    def test_long():
        child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(600)"])
        out = os.path.join(os.environ["PIDS"], f"{os.getpid()}")
        with open(out + ".tmp", "w") as fh:
            fh.write(f"{os.getpid()} {os.getpgid(0)} {child.pid}")
        os.replace(out + ".tmp", out)
        time.sleep(600)
"""


def _caught(pid: int) -> int:
    """The runner's caught-signal mask (SigCgt), 0 when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def _handles_signals(pid: int) -> bool:
    mask = _caught(pid)
    return bool(mask >> (signal.SIGINT - 1) & 1 and mask >> (signal.SIGTERM - 1) & 1)


def _recorded(pids: Path) -> list[tuple[int, int, int]]:
    return [tuple(map(int, p.read_text().split())) for p in pids.iterdir()
            if not p.name.endswith(".tmp")]


def _left(records: list[tuple[int, int, int]]) -> list[int]:
    """Processes still alive among those the entries recorded, or in their groups."""
    left = set()
    for pid, pgid, child in records:
        left |= {p for p in (pid, child) if alive(p)}
        left |= set(group_members(pgid))
    return sorted(left)


def _wait_gone(records: list[tuple[int, int, int]], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := _left(records)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _start(root: Path, pids: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PIDS": str(pids)}
    env.pop("GITHUB_ACTIONS", None)
    return subprocess.Popen([sys.executable, "-m", "ci", "run", "--suite", "cpu_unit", "--root",
                             str(root), "-j", "2"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.fixture
def checkout(tmp_path):
    return write(tmp_path / "repo", {f"tests/test_long_{i}.py": code(LONG) for i in range(3)})


def test_interrupts_at_random_moments_under_load_end_every_run(checkout, tmp_path):
    """Many runs at once (two entries each, on two cores), each signalled once or twice at a
    random moment: while planning, while entries start, while they run, while stopping."""
    # A new draw each time (the failure names its seed; SLIME_CI_TEST_SEED replays it).
    seed = os.environ.get("SLIME_CI_TEST_SEED") or str(random.randrange(1 << 30))
    rng = random.Random(seed)
    rounds, at_once = 4, 4
    for round_no in range(rounds):
        runs = []
        for i in range(at_once):
            pids = tmp_path / f"pids-{round_no}-{i}"
            pids.mkdir()
            runs.append((_start(checkout, pids), pids, rng.choice((signal.SIGINT, signal.SIGTERM)),
                         rng.uniform(0.0, 4.0), rng.random() < 0.3))
        for proc, *_ in runs:
            # Signals sent before Python has installed any handler would meet the kernel's
            # default for SIGTERM (death, not exit 130): wait until the runner catches both.
            deadline = time.monotonic() + 30
            while not _handles_signals(proc.pid) and proc.poll() is None:
                assert time.monotonic() < deadline, "the runner never installed its handlers"
                time.sleep(0.005)
        start = time.monotonic()
        pending = sorted(runs, key=lambda r: r[3])
        for proc, _, sig, delay, twice in pending:
            time.sleep(max(0.0, start + delay - time.monotonic()))
            proc.send_signal(sig)
            if twice:
                time.sleep(rng.uniform(0.0, 0.5))
                proc.send_signal(sig)
        for proc, pids, sig, delay, _twice in runs:
            try:
                out, _ = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate()
                pytest.fail(f"seed {seed}: run not ended 60 s after {sig.name} at {delay:.2f}s:\n"
                            f"{out[-3000:]}")
            assert proc.returncode == 130, f"seed {seed}: {sig.name} at {delay:.2f}s:\n{out[-3000:]}"
            assert _wait_gone(_recorded(pids)) == [], f"seed {seed}: {sig.name} at {delay:.2f}s left processes"


def test_interrupted_closing_line_counts_entries_apart(checkout, tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = _start(checkout, pids)
    deadline = time.monotonic() + 60
    while len(_recorded(pids)) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "entries never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    closing = [line for line in out.splitlines()
               if line.startswith("cpu_unit: ") and "skipped" in line]
    assert closing == ["cpu_unit: interrupted; 0 of 3 entries finished (3 stopped or never run); "
                       "tests: 0 passed, 0 failed, 0 skipped"], out


def test_sigkill_of_the_runner_leaves_nothing_running(tmp_path):
    """Entries die with the runner, and so do the groups an entry started through U."""
    pids = tmp_path / "pids"
    pids.mkdir()
    root = write(tmp_path / "repo", {"tests/test_u.py": code(f"""
        import os, pytest
        from slime.utils.external_utils import command_utils as U
        NUM_GPUS = 0
        def test_holds_a_group_of_its_own():
            out = {str(pids)!r}
            open(os.path.join(out, "entry"), "w").write(f"{{os.getpid()}} {{os.getpgid(0)}}")
            # A group of its own, as U's commands and private Ray heads are.
            U.exec_command(f"echo $$ > {{out}}/u.tmp && mv {{out}}/u.tmp {{out}}/u && sleep 600")
    """)})
    proc = _start(root, pids)
    deadline = time.monotonic() + 60
    while not ((pids / "entry").exists() and (pids / "u").exists()):
        assert time.monotonic() < deadline and proc.poll() is None, "the entry never started"
        time.sleep(0.05)
    entry, entry_group = map(int, (pids / "entry").read_text().split())
    u_group = int((pids / "u").read_text())
    assert entry == entry_group and u_group != entry_group
    assert group_members(u_group), "U's group is not running"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 15
    while (alive(entry) or group_members(entry_group) or group_members(u_group)) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(entry), "the entry outlived its runner"
    assert group_members(entry_group) == [], "processes of the entry's group outlived the runner"
    assert group_members(u_group) == [], "the group the entry started through U outlived it"


# A group leader that ignores SIGTERM, and a child in its group that ignores it too.
STUBBORN = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "subprocess.Popen([sys.executable, '-S', '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n")


def _group_gone(pgid: int, within: float = 5.0) -> bool:
    """The group has no member left, allowing the kernel the moment a SIGKILLed process
    takes to leave the process table (a loaded host shows it for a while)."""
    deadline = time.monotonic() + within
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _stubborn() -> subprocess.Popen[str]:
    proc = start([sys.executable, "-S", "-c", STUBBORN], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.stdout.close()
    return proc


def test_wait_exit_times_out_then_leaves_the_leader_unreaped():
    proc = start([sys.executable, "-S", "-c", "import time; time.sleep(0.5)"])
    began = time.monotonic()
    assert wait_exit(proc.pid, 0.1) is False
    assert time.monotonic() - began < 0.4
    assert wait_exit(proc.pid, 30) is True
    # Exited but unreaped: a zombie, so its pid (its group id) cannot be reused yet.
    assert Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert proc.wait() == 0


def test_wait_exit_follows_a_process_that_is_not_our_child():
    # A grandchild (what a pre-imported worker's fork is to the runner).
    shell = subprocess.Popen([sys.executable, "-S", "-c",
                              "import subprocess, sys; p = subprocess.Popen([sys.executable, '-S', '-c', "
                              "'import time; time.sleep(0.5)']); print(p.pid, flush=True); p.wait()"],
                             stdout=subprocess.PIPE, text=True)
    assert shell.stdout is not None
    grandchild = int(shell.stdout.readline())
    assert wait_exit(grandchild, 0.05) is False
    assert wait_exit(grandchild, 30) is True
    shell.wait()
    shell.stdout.close()


def test_stop_group_kills_what_ignores_sigterm_after_the_grace():
    proc = _stubborn()
    began = time.monotonic()
    stop_group(proc.pid, 0.5)
    took = time.monotonic() - began
    assert 0.4 < took < 10, took
    assert proc.wait() == -signal.SIGKILL
    assert _group_gone(proc.pid)


def test_stop_group_waits_with_the_callers_finished_and_spares_sigkill():
    proc = start([sys.executable, "-S", "-c", "import time; time.sleep(600)"])
    waits: list[float] = []

    def finished(seconds: float) -> bool:
        waits.append(seconds)
        return wait_exit(proc.pid, seconds)

    stop_group(proc.pid, 5.0, finished=finished)
    assert waits == [5.0]
    assert proc.wait() == -signal.SIGTERM  # SIGTERM sufficed: no SIGKILL followed


def test_groups_stop_every_tracked_group_and_refuse_new_ones():
    groups = Groups()
    stubborn, polite = _stubborn(), start([sys.executable, "-S", "-c", "import time; time.sleep(600)"])
    assert groups.add(stubborn.pid) and groups.add(polite.pid)

    def reaper(proc: subprocess.Popen[str]) -> None:
        wait_exit(proc.pid)
        groups.discard(proc.pid)  # forgotten before it is reaped, as the executor does
        proc.wait()

    import threading

    threads = [threading.Thread(target=reaper, args=(p,)) for p in (stubborn, polite)]
    for t in threads:
        t.start()
    groups.stop(0.5)
    for t in threads:
        t.join(10)
    assert (stubborn.returncode, polite.returncode) == (-signal.SIGKILL, -signal.SIGTERM)
    assert _group_gone(stubborn.pid)
    late = start([sys.executable, "-S", "-c", "import time; time.sleep(600)"])
    assert groups.add(late.pid) is False  # the run is stopping: the caller kills it
    stop_group(late.pid, 0.1)
    late.wait()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
