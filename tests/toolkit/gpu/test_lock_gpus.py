"""`python -m ci lock-gpus` / `gpu-status` as real processes contending on real lock files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _lock_helpers import (
    REPO,
    kill_tree,
    lock_argv,
    overlaps,
    read_runs,
    recorder,
    spawn,
    wait_for,
)

from ci.errors import UsageError
from ci.gpu import allocator

NUM_GPUS = 0

# Waiting for a subprocess must never hang the suite.
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pattern(tmp_path: Path) -> str:
    return str(tmp_path / "shm" / "custom_gpu_lock_{gpu_id}.lock")


def _status(pattern: str, total: int) -> dict[str, list[dict[str, object]]]:
    out = subprocess.run([sys.executable, "-m", "ci", "gpu-status", "--json", "--total-gpus",
                          str(total), "--lock-path-pattern", pattern], cwd=REPO, text=True,
                         capture_output=True, timeout=30, check=True).stdout
    data: dict[str, list[dict[str, object]]] = json.loads(out)
    return data


def _held(pattern: str, total: int) -> set[int]:
    return {g.gpu for g in allocator.read_status(pattern, total).gpus if g.holder is not None}


def test_many_contenders_never_share_a_gpu(pattern: str, tmp_path: Path) -> None:
    log = tmp_path / "runs.log"
    plans = [["--count", "1"], ["--count", "2"], ["--devices", "2,0"], ["--count", "3"],
             ["--devices", "1"], ["--count", "1"], ["--devices", "0,1"], ["--count", "2"]]
    procs = [spawn(lock_argv(pattern, ["--total-gpus", "3", "--timeout", "40", *flags],
                             recorder(log, f"job{i}", 0.15)))
             for i, flags in enumerate(plans)]
    for p in procs:
        _out, err = p.communicate(timeout=50)
        assert p.returncode == 0, err
    runs = read_runs(log)
    assert len(runs) == len(plans)
    assert overlaps(runs) == []
    by_tag = {r.tag: r for r in runs}
    # Each command saw exactly the GPUs it asked for, through CUDA_VISIBLE_DEVICES.
    assert by_tag["job2"].devices == (0, 2)
    assert by_tag["job4"].devices == (1,)
    assert len(by_tag["job3"].devices) == 3
    assert all(len(by_tag[f"job{i}"].devices) == 2 for i in (1, 7))


@pytest.mark.parametrize(("flags", "message"), [
    (["--", "true"], "--count N or --devices"),
    (["--count", "1", "--devices", "0", "--", "true"], "not both"),
    (["--count", "0", "--", "true"], "at least 1"),
    (["--count", "5", "--", "true"], "more than the 4 GPU"),
    (["--devices", "0,4", "--", "true"], "GPU 4 does not exist"),
    (["--devices", "1,1", "--", "true"], "listed twice"),
    (["--devices", "a,b", "--", "true"], "GPU indices"),
    (["--count", "1"], "no command"),
    (["--count", "1", "--"], "no command"),
    (["--count", "1", "--lock-path-pattern", "/tmp/one_lock.lock", "--", "true"],
     "must contain {gpu_id}"),
    (["--count", "1", "--bogus", "--", "true"], "unrecognized arguments"),
])
def test_impossible_requests_exit_2_with_one_line(pattern: str, flags: list[str],
                                                  message: str) -> None:
    argv = [sys.executable, "-m", "ci", "lock-gpus", "--total-gpus", "4",
            "--lock-path-pattern", pattern, *flags]
    started = time.monotonic()
    res = subprocess.run(argv, cwd=REPO, text=True, capture_output=True, timeout=30)
    assert res.returncode == 2, res.stderr
    assert time.monotonic() - started < 10
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.stderr
    assert res.stdout == ""


def test_timeout_exits_124_naming_the_holder(pattern: str) -> None:
    holder = spawn(lock_argv(pattern, ["--count", "2", "--total-gpus", "2"],
                             [sys.executable, "-S", "-c", "import time; time.sleep(30)"]))
    try:
        wait_for(lambda: _held(pattern, 2) == {0, 1})
        res = subprocess.run(lock_argv(pattern, ["--devices", "1", "--total-gpus", "2",
                                                 "--timeout", "0.3"], ["true"]),
                             cwd=REPO, text=True, capture_output=True, timeout=30)
    finally:
        kill_tree(holder)
    assert res.returncode == 124
    assert "Traceback" not in res.stderr
    line, = res.stderr.strip().splitlines()
    assert f"GPU 1 is held by pid {holder.pid}" in line
    # The program by name, then what it runs: a venv's long interpreter path (a fresh clone
    # under a deep temp folder) once used up the line before `time.sleep(30)`.
    assert f"(`{Path(sys.executable).name} -S -c " in line
    assert "time.sleep(30)" in line and "since" in line


def test_sigkill_of_holder_frees_its_gpus_at_once(pattern: str, tmp_path: Path) -> None:
    """The whole holder tree dies: the kernel drops the flocks; the waiter starts promptly."""
    log = tmp_path / "runs.log"
    holder = spawn(lock_argv(pattern, ["--count", "2", "--total-gpus", "2"],
                             [sys.executable, "-S", "-c", "import time; time.sleep(30)"]))
    wait_for(lambda: _held(pattern, 2) == {0, 1})
    waiter = spawn(lock_argv(pattern, ["--count", "2", "--total-gpus", "2", "--timeout", "30"],
                             recorder(log, "waiter", 0.0)))
    wait_for(lambda: len(allocator.read_status(pattern, 2).waiters) == 1)
    killed_at = time.monotonic()
    kill_tree(holder)  # wrapper and command, as an OOM kill or a container stop would
    assert _held(pattern, 2) <= {0, 1}
    _out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, err
    run, = read_runs(log)
    # Nobody announced the release; the waiter's periodic check finds it.
    assert run.start - killed_at < 1.5
    assert allocator.read_status(pattern, 2).waiters == ()


def _hold_one_gpu(pattern: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """`lock-gpus` holding GPU 0 for a command that sleeps and writes its pid to a marker."""
    marker = tmp_path / "child.pid"
    holder = spawn(lock_argv(pattern, ["--count", "1", "--total-gpus", "1"],
                             [sys.executable, "-S", "-c",
                              f"import os, time; open({str(marker)!r}, 'w').write("
                              "str(os.getpid())); time.sleep(30)"]))
    return holder, marker


def _holding_child(pattern: str, marker: Path) -> int:
    """The command's pid, once the lock records it as the holder's child."""
    wait_for(lambda: marker.exists() and marker.read_text() != "")
    child = int(marker.read_text())
    wait_for(lambda: (h := allocator.read_status(pattern, 1).gpus[0].holder) is not None
             and h.child_pid == child)
    return child


def test_sigkill_of_the_wrapper_leaves_the_locks_with_the_command(pattern: str,
                                                                  tmp_path: Path) -> None:
    """Exclusive even then: the command still runs, so its GPUs must stay locked."""
    holder, marker = _hold_one_gpu(pattern, tmp_path)
    child = 0
    try:
        child = _holding_child(pattern, marker)
        holder.send_signal(signal.SIGKILL)  # only the wrapper
        holder.wait(timeout=10)  # (the command keeps the output pipes open)
        os.kill(child, 0)  # the command lives on...
        st = allocator.read_status(pattern, 1)
        assert st.gpus[0].holder is not None  # ...and still holds its GPU
        assert st.gpus[0].holder.pid == holder.pid
        assert st.gpus[0].holder.child_pid == child
        res = subprocess.run(lock_argv(pattern, ["--count", "1", "--total-gpus", "1",
                                                 "--timeout", "0.3"], ["true"]),
                             cwd=REPO, text=True, capture_output=True, timeout=30)
        assert res.returncode == 124
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
        kill_tree(holder)
    wait_for(lambda: _held(pattern, 1) == set(), timeout=5)


def test_a_gone_wrapper_is_not_named_as_the_holder(pattern: str, tmp_path: Path) -> None:
    """Once the wrapper is SIGKILLed, gpu-status and a waiter's timeout name the command,
    which holds the GPU through the inherited descriptor, not a pid that no longer exists."""
    holder, marker = _hold_one_gpu(pattern, tmp_path)
    child = 0
    try:
        child = _holding_child(pattern, marker)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        status = subprocess.run([sys.executable, "-m", "ci", "gpu-status", "--total-gpus", "1",
                                 "--lock-path-pattern", pattern], cwd=REPO, text=True,
                                capture_output=True, timeout=30, check=False)
        assert status.returncode == 0, status.stderr
        assert f"0    held  {child:>8}" in status.stdout, status.stdout
        assert str(holder.pid) not in status.stdout
        res = subprocess.run(lock_argv(pattern, ["--count", "1", "--total-gpus", "1",
                                                 "--timeout", "0.3"], ["true"]),
                             cwd=REPO, text=True, capture_output=True, timeout=30)
        assert res.returncode == 124
        assert f"GPU 0 is held by pid {child} " in res.stderr, res.stderr
        assert f"pid {holder.pid}" not in res.stderr
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
        kill_tree(holder)
    wait_for(lambda: _held(pattern, 1) == set(), timeout=5)


def test_exit_codes_pass_through(pattern: str) -> None:
    flags = ["--count", "1", "--total-gpus", "2"]
    procs = {
        7: spawn(lock_argv(pattern, flags, ["sh", "-c", "exit 7"])),
        0: spawn(lock_argv(pattern, flags, ["true"])),
        128 + 9: spawn(lock_argv(pattern, flags, ["sh", "-c", "kill -9 $$"])),
        127: spawn(lock_argv(pattern, flags, ["no-such-command-xyz"])),
    }
    for code, proc in procs.items():
        proc.communicate(timeout=30)
        assert proc.returncode == code


def test_quoting_is_preserved(pattern: str) -> None:
    res = subprocess.run(
        lock_argv(pattern, ["--count", "1", "--total-gpus", "1"],
                  [sys.executable, "-S", "-c", "import sys; print('a b'); print(sys.argv[1:])",
                   "x  y", "", "$HOME", "'q'"]),
        cwd=REPO, text=True, capture_output=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["a b", "['x  y', '', '$HOME', \"'q'\"]"]


def test_command_sees_its_gpus_in_the_target_variable(pattern: str) -> None:
    res = subprocess.run(
        lock_argv(pattern, ["--devices", "2,1", "--total-gpus", "3", "--target-env-name",
                            "HIP_VISIBLE_DEVICES"],
                  [sys.executable, "-S", "-c",
                   "import os; print(os.environ['HIP_VISIBLE_DEVICES'])"]),
        cwd=REPO, text=True, capture_output=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1,2"


_TRAP = ("import signal, sys, time\n"
         "def on(s, f):\n"
         "    open(sys.argv[1], 'w').write(str(s)); sys.exit(0)\n"
         "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): signal.signal(s, on)\n"
         "open(sys.argv[1], 'w').write('ready')\n"
         "time.sleep(30)\n")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_are_forwarded_to_the_command(pattern: str, tmp_path: Path,
                                              sig: signal.Signals) -> None:
    got = tmp_path / "got"
    proc = spawn(lock_argv(pattern, ["--count", "1", "--total-gpus", "1"],
                           [sys.executable, "-S", "-c", _TRAP, str(got)]))
    try:
        wait_for(lambda: got.exists() and got.read_text() == "ready")
        proc.send_signal(sig)
        proc.communicate(timeout=20)
    finally:
        kill_tree(proc)
    assert got.read_text() == str(int(sig))  # the command got the same signal
    assert proc.returncode == 128 + sig


def test_a_command_ignoring_the_signal_is_killed_after_the_grace(pattern: str,
                                                                tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"open({str(ready)!r}, 'w').close(); time.sleep(30)")
    proc = spawn(lock_argv(pattern, ["--count", "1", "--total-gpus", "1", "--grace", "0.3"],
                           [sys.executable, "-S", "-c", code]))
    try:
        wait_for(ready.exists)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
        took = time.monotonic() - sent
    finally:
        kill_tree(proc)
    assert proc.returncode == 128 + signal.SIGTERM
    assert 0.25 <= took < 5
    assert _held(pattern, 1) == set()


def test_signal_while_waiting_leaves_the_queue(pattern: str) -> None:
    holder = spawn(lock_argv(pattern, ["--count", "1", "--total-gpus", "1"],
                             [sys.executable, "-S", "-c", "import time; time.sleep(30)"]))
    try:
        wait_for(lambda: _held(pattern, 1) == {0})
        waiter = spawn(lock_argv(pattern, ["--count", "1", "--total-gpus", "1"], ["true"]))
        wait_for(lambda: len(allocator.read_status(pattern, 1).waiters) == 1)
        waiter.send_signal(signal.SIGTERM)
        _, err = waiter.communicate(timeout=20)
        assert waiter.returncode == 128 + signal.SIGTERM
        assert "Traceback" not in err
        assert allocator.read_status(pattern, 1).waiters == ()
    finally:
        kill_tree(holder)


def test_leftover_background_processes_do_not_keep_the_gpus(pattern: str,
                                                            tmp_path: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    res = subprocess.run(
        lock_argv(pattern, ["--count", "1", "--total-gpus", "1", "--grace", "1"],
                  ["sh", "-c", f"sleep 30 & echo $! > {pidfile}; exit 3"]),
        cwd=REPO, text=True, capture_output=True, timeout=30)
    assert res.returncode == 3
    bg = int(pidfile.read_text())
    wait_for(lambda: not Path(f"/proc/{bg}").exists() or
             Path(f"/proc/{bg}/stat").read_text().split(") ")[1].startswith("Z"), timeout=5)
    assert _held(pattern, 1) == set()


def test_gpu_status_shows_holders_and_the_queue(pattern: str) -> None:
    holder = spawn(lock_argv(pattern, ["--devices", "1", "--total-gpus", "2"],
                             [sys.executable, "-S", "-c", "import time; time.sleep(30)"]))
    waiter = None
    try:
        wait_for(lambda: _held(pattern, 2) == {1})
        waiter = spawn(lock_argv(pattern, ["--count", "2", "--total-gpus", "2"], ["true"]))
        wait_for(lambda: len(allocator.read_status(pattern, 2).waiters) == 1)
        data = _status(pattern, 2)
        gpus = data["gpus"]
        assert gpus[0]["state"] == "free" and gpus[1]["state"] == "held"
        assert gpus[1]["pid"] == holder.pid and "time.sleep(30)" in str(gpus[1]["command"])
        (w,) = data["waiters"]
        assert w["pid"] == waiter.pid and w["count"] == 2 and w["command"] == "true"
        table = subprocess.run([sys.executable, "-m", "ci", "gpu-status", "--total-gpus", "2",
                                "--lock-path-pattern", pattern], cwd=REPO, text=True,
                               capture_output=True, timeout=30, check=True).stdout
        assert "0    free" in table and f"held  {holder.pid:>8}" in table
        assert f"pid {waiter.pid}" in table and "wants 2 GPU(s): true" in table
        # --print-only: GPU 0 is free but claimed by the waiter, so nothing is free now.
        res = subprocess.run(lock_argv(pattern, ["--total-gpus", "2", "--print-only",
                                                 "--count", "1"], []),
                             cwd=REPO, text=True, capture_output=True, timeout=30)
        assert res.returncode == 0 and res.stdout.strip() == ""
        assert "would wait" in res.stderr
    finally:
        kill_tree(holder)
        if waiter is not None:
            kill_tree(waiter)


# No GPU here, and on a GPU machine NVML's answer is what this checks against: a stand-in
# module answers for NVML (named so in each test), as no driver can be had here.
class _NoNvml:
    def nvmlInit(self) -> None:
        raise RuntimeError("NVML Shared Library Not Found")


class _Nvml:
    def __init__(self, count: int) -> None:
        self.count = count

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlShutdown(self) -> None:
        pass


@pytest.mark.parametrize("command", [["lock-gpus", "--print-only"], ["gpu-status"]])
def test_without_a_gpu_the_assumed_8_are_said_on_stderr(pattern: str, command: list[str],
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from ci.gpu import lock_gpus

    run = lock_gpus.main if command[0] == "lock-gpus" else lock_gpus.status_main
    monkeypatch.setitem(sys.modules, "pynvml", _NoNvml())  # stand-in: a machine without NVML
    assert run([*command[1:], "--lock-path-pattern", pattern]) == 0
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (f"{command[0]}: NVML reports no GPU here (no driver, library "
                                   "or device); assuming 8: pass --total-gpus N to say how many")
    if command[0] == "lock-gpus":  # a refusal stays its one line: nothing is said before it
        with pytest.raises(UsageError, match="--timeout nan"):
            run(["--count", "1", "--timeout", "nan", "--lock-path-pattern", pattern, "--", "true"])
        assert capsys.readouterr().err == ""
    for told in (["--total-gpus", "2"], []):  # told, or NVML answers (a stand-in): silent
        monkeypatch.setitem(sys.modules, "pynvml", _Nvml(2))
        assert run([*command[1:], "--lock-path-pattern", pattern, *told]) == 0
        assert "assuming" not in capsys.readouterr().err


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
