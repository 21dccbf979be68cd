"""`U.execute_train` against real Ray heads on loopback (three heads in all: Ray is slow to start).

A submitted script sees the runtime env; a failing job raises; two calls at once each get
their own head and ports; after every call no process of its head remains, checked by pid.
"""

import contextlib
import json
import os
import socket
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

import slime.utils.external_utils.command_utils as U
from slime.utils.external_utils.ray_head import PORT_BLOCK_SIZE, free_port_block

NUM_GPUS = 0

PROBE = textwrap.dedent("""
    import json, os, sys, time
    out = sys.argv[1]
    names = ["PROBE", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH", "CUDA_DEVICE_MAX_CONNECTIONS",
             "NCCL_NVLS_ENABLE", "no_proxy", "SLIME_CI_DEVICE", "SLIME_CI_OUTPUT_DIR",
             "CUDA_VISIBLE_DEVICES"]
    with open(out, "w") as fh:
        json.dump({"env": {n: os.environ.get(n) for n in names}, "argv": sys.argv[2:],
                   "pid": os.getpid()}, fh)
    print("probe wrote", out, flush=True)
    if "--fail" in sys.argv:
        print("failing on purpose", flush=True)
        sys.exit(3)
""")


def _alive(pids):
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            pass
    return alive


def _free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "in use"
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _env(tmp_path, base, name):
    out = tmp_path / name
    out.mkdir()
    return {**os.environ, "SLIME_CI_PORT_BASE": str(base), "SLIME_CI_OUTPUT_DIR": str(out),
            "SLIME_CI_DEVICE": "cpu", "TMPDIR": str(tmp_path)}


@pytest.mark.timeout(600)
def test_job_sees_runtime_env_and_head_is_gone_after(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    result = tmp_path / "result.json"
    base = free_port_block()
    heads, record = [], []
    # As the runner sets it under --emulate-gpus: one logical GPU, none visible to torch.
    env = {**_env(tmp_path, base, "out"), "CUDA_VISIBLE_DEVICES": "", "SLIME_CI_EMULATE_GPUS": "1"}
    job_id = U.execute_train(
        [str(result), "--name", "two words"], 1, None, train_script=str(script),
        before_ray_job_submit=heads.append, extra_env_vars={"PROBE": "seen"},
        env=env, timeout=300, head_record=record,
    )
    assert job_id
    seen = json.loads(result.read_text())
    env = seen["env"]
    assert seen["argv"] == ["--name", "two words"]
    assert env["PROBE"] == "seen"
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(base + 9)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and env["NCCL_NVLS_ENABLE"] in ("0", "1")
    assert "127.0.0.1" in env["no_proxy"].split(",")
    assert env["SLIME_CI_DEVICE"] == "cpu" and env["SLIME_CI_OUTPUT_DIR"] == str(tmp_path / "out")
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    # The hook ran against this entry's head, on this entry's ports.
    assert [h.address for h in heads] == [f"http://127.0.0.1:{base + 1}"]
    (rec,) = record
    assert heads[0].pid in rec.pids and len(rec.pids) > 3
    assert _alive([*rec.pids, seen["pid"]]) == []
    assert not rec.temp_dir.exists()
    assert _free(base) and _free(base + 1)


@pytest.mark.timeout(900)
def test_two_calls_at_once_do_not_collide_and_a_failure_raises(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    base_a = free_port_block()
    base_b = free_port_block()
    while abs(base_b - base_a) < PORT_BLOCK_SIZE:
        base_b = free_port_block()
    both_up = threading.Barrier(2, timeout=600)
    records = {"ok": [], "bad": []}

    def run(name, base, extra):
        return U.execute_train(
            [str(tmp_path / f"{name}.json"), *extra], 1, None, train_script=str(script),
            before_ray_job_submit=lambda head: both_up.wait(),  # both heads run at once
            env=_env(tmp_path, base, name), timeout=300, head_record=records[name],
        )

    with ThreadPoolExecutor(2) as pool:
        ok = pool.submit(run, "ok", base_a, [])
        bad = pool.submit(run, "bad", base_b, ["--fail"])
        assert ok.result(timeout=800)
        with pytest.raises(U.TrainJobFailed) as info:
            bad.result(timeout=800)
    assert info.value.status == "FAILED"
    assert "failing on purpose" in info.value.logs_tail
    ok_env = json.loads((tmp_path / "ok.json").read_text())["env"]
    bad_env = json.loads((tmp_path / "bad.json").read_text())["env"]
    assert (ok_env["MASTER_PORT"], bad_env["MASTER_PORT"]) == (str(base_a + 9), str(base_b + 9))
    (rec_ok,), (rec_bad,) = records["ok"], records["bad"]
    assert rec_ok.pids.isdisjoint(rec_bad.pids)
    assert rec_ok.temp_dir != rec_bad.temp_dir
    assert not rec_ok.temp_dir.exists() and not rec_bad.temp_dir.exists()
    assert _alive(rec_ok.pids | rec_bad.pids) == []


HOLDER = textwrap.dedent("""
    import os, sys, time
    from slime.utils.external_utils.ray_head import private_head
    with private_head(num_gpus=0, env=dict(os.environ)) as head:
        with open(sys.argv[1] + ".tmp", "w") as fh:
            fh.write(f"{head.pid} {head.token}")
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(600)
""")


def _owned(token):
    needle = f"SLIME_CI_RAY_OWNER={token}".encode()
    found = []
    for proc in psutil.process_iter():
        try:
            if needle in Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0"):
                found.append(proc.pid)
        except OSError:
            pass
    return found


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_private_head_dies_with_the_process_that_started_it(tmp_path, sig):
    """SIGKILL of the entry (as when its runner's guard kills it) takes its head along; SIGTERM
    (a runner's timeout, with SIGKILL a few seconds later) stops the head from the entry itself."""
    import signal
    import subprocess
    import time

    info = tmp_path / "head"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(info)], env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not info.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the head never started"
            time.sleep(0.2)
        leader, token = info.read_text().split()
        assert _alive(_owned(token)), "no process of the head found"
    finally:
        proc.send_signal(getattr(signal, sig))
        code = proc.wait(timeout=60)
    if sig == "SIGTERM":
        # The entry's own clean-up ran (not the default action, which would be -SIGTERM) and
        # returned only once the head's processes were gone.
        assert code == 128 + signal.SIGTERM, code
        assert _alive(_owned(token)) == [] and _alive([int(leader)]) == []
    deadline = time.monotonic() + 30
    while (_alive(_owned(token)) or _alive([int(leader)])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(_owned(token)) == [] and _alive([int(leader)]) == []


@pytest.mark.parametrize("ignores_sigterm", [False, True])
def test_a_process_of_the_head_left_behind_its_raylet_is_stopped_in_seconds(tmp_path, ignores_sigterm):
    """A Ray worker whose raylet is gone can linger for the whole grace before it notices.
    Once `ray start` has exited, what is left of the head (found by its token) gets SIGTERM,
    then SIGKILL after ORPHAN_GRACE: the stop takes seconds, not the 15 s grace."""
    import signal
    import subprocess
    import time

    from slime.utils.external_utils import ray_head as RH

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("SLIME_CI_PORT_BASE", None)
    record = []
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)" \
        if ignores_sigterm else "import time; time.sleep(600)"
    with RH.private_head(num_gpus=0, env=env, record=record) as head:
        # Its own session: the signal to the head's group does not reach it, as for such a worker.
        straggler = subprocess.Popen([sys.executable, "-c", code], env={**env, RH.OWNER_VAR: head.token},
                                     start_new_session=True)
        started = time.monotonic()
    stopped_in = time.monotonic() - started
    try:
        (rec,) = record
        assert straggler.pid in rec.pids
        status = straggler.wait(timeout=5)
        assert status == (-signal.SIGKILL if ignores_sigterm else -signal.SIGTERM)
        assert stopped_in < 10, f"the head took {stopped_in:.1f} s to stop"
        assert _alive(rec.pids) == []
    finally:
        if straggler.poll() is None:
            straggler.kill()
            straggler.wait()


def test_a_token_left_in_the_home_by_another_ray_does_not_lock_drivers_out(tmp_path):
    """The first `ray.init()` that starts a local cluster on an account writes
    ~/.ray/auth_token; a head started later on that account would then refuse every driver
    that brings no token (a test run that hung for minutes). A private head takes none."""
    import subprocess

    from slime.utils.external_utils import ray_head as RH

    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0" * 64)
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"} | {
        "TMPDIR": str(tmp_path), "HOME": str(home)}
    env.pop("SLIME_CI_PORT_BASE", None)
    with RH.private_head(num_gpus=0, env=env) as head:
        # A driver of another account (no token of its own) joins and runs a task.
        bare = {**env, "HOME": str(tmp_path / "elsewhere")}
        code = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
                "print(ray.get(ray.remote(lambda: 42).remote()))")
        joined = subprocess.run([sys.executable, "-c", code, head.gcs_address], env=bare,
                                capture_output=True, text=True, timeout=120)
    assert joined.returncode == 0 and joined.stdout.strip().endswith("42"), joined.stderr[-2000:]


def test_a_head_that_is_up_yields_the_cpu_to_heads_still_starting(tmp_path):
    """Start-up has the raylet's fixed 15 s; a head that is up has no deadline. Once up, every
    thread of its processes, and a worker it starts afterwards, runs PRIORITY_STEP nice levels
    below where its start-up ran (this account may raise a start-up, root: at the entry's own
    level; else PRIORITY_STEP below it); the entry's own process keeps its level."""
    import subprocess

    from slime.utils.external_utils import ray_head as RH

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("SLIME_CI_PORT_BASE", None)
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    # Whether this account may raise a process above its own level (asked of a child).
    probe = "import os; os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) - 1)"
    may_raise = subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0
    steady = mine if may_raise else min(19, mine + RH.PRIORITY_STEP)
    with RH.private_head(num_gpus=0, env=env) as head:
        pids = _owned(head.token)
        assert len(pids) >= 5, pids  # gcs, raylet, dashboard, agents, `ray start` itself
        niced = {}
        for pid in pids:
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    niced[(pid, int(tid))] = os.getpriority(os.PRIO_PROCESS, int(tid))
        assert niced and all(v == steady for v in niced.values()), (steady, niced)
        # The sessions too: with autogroups on, CPU is shared between sessions first.
        sessions = {}
        for pid in pids:
            with contextlib.suppress(OSError):
                sessions[pid] = int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
        assert all(v == steady for v in sessions.values()), (steady, sessions)
        # A task's worker, started by the raylet after the head came up: its session's level is
        # the head's (its own nice value Ray sets to worker_niceness, 15, itself).
        code = ("import os, ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
                "f = lambda: (os.getpriority(os.PRIO_PROCESS, 0), open('/proc/self/autogroup').read().split()[-1]); "
                "print(*ray.get(ray.remote(f).remote()))")
        task = subprocess.run([sys.executable, "-c", code, head.gcs_address], env=env,
                              capture_output=True, text=True, timeout=180)
    assert task.returncode == 0, task.stderr[-2000:]
    own, session = map(int, task.stdout.split()[-2:])
    assert own >= steady and session == steady, task.stdout
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine, "the entry's own process keeps its priority"


# A stand-in for `ray` on a loaded host: this machine cannot be made slow enough on demand for
# Ray's fixed 30 s raylet wait to run out, so the first `ray start` prints what Ray prints then
# and exits 1, as it does; later calls run the real CLI.
FLAKY_RAY = textwrap.dedent("""\
    #!{python}
    import os, sys
    marker = {marker!r}
    if {failures} > len(os.listdir(marker)):
        open(os.path.join(marker, str(len(os.listdir(marker)))), "w").close()
        print("Exception: {line}", flush=True)
        sys.exit(1)
    os.execv({ray!r}, [{ray!r}, *sys.argv[1:]])
""")


def _flaky_ray(tmp_path, failures, line):
    from slime.utils.external_utils import ray_head as RH

    marker = tmp_path / "starts"
    marker.mkdir()
    cli = tmp_path / "ray"
    cli.write_text(FLAKY_RAY.format(python=sys.executable, marker=str(marker), failures=failures,
                                    line=line, ray=RH.ray_executable()))
    cli.chmod(0o755)
    return cli, marker


def test_a_head_that_timed_out_starting_is_started_again(tmp_path, capfd):
    from slime.utils.external_utils import ray_head as RH

    cli, marker = _flaky_ray(tmp_path, 1, "The current node timed out during startup. This could "
                                          "happen because some of the raylet failed to startup.")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("SLIME_CI_PORT_BASE", None)
    record = []
    with RH.private_head(num_gpus=0, env=env, record=record, ray_cli=str(cli)) as head:
        assert "Ray runtime started." in (head.temp_dir / "head.2.log").read_text()
        assert "timed out during startup" in (head.temp_dir / "head.log").read_text()
    assert len(os.listdir(marker)) == 1
    assert "starting it again, attempt 2 of 3" in capfd.readouterr().out
    (rec,) = record
    assert _alive(rec.pids) == [] and not rec.temp_dir.exists()


def test_a_head_that_fails_for_another_reason_is_not_retried(tmp_path):
    from slime.utils.external_utils import ray_head as RH

    cli, marker = _flaky_ray(tmp_path, 3, "ValueError: --num-gpus must be a number")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("SLIME_CI_PORT_BASE", None)
    with pytest.raises(RuntimeError, match="ray head exited with code 1 while starting") as err, \
            RH.private_head(num_gpus=0, env=env, ray_cli=str(cli)):
        pytest.fail("the head must not start")
    assert "time(s)" not in str(err.value)
    assert len(os.listdir(marker)) == 1  # one start, no retry


def test_a_head_timing_out_every_time_gives_up_after_its_attempts(tmp_path):
    from slime.utils.external_utils import ray_head as RH

    cli, marker = _flaky_ray(tmp_path, 5, "The current node timed out during startup.")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("SLIME_CI_PORT_BASE", None)
    with pytest.raises(RuntimeError, match=r"timed out during its own start-up 2 time\(s\), the last: ray head exited with code 1") as err, \
            RH.private_head(num_gpus=0, env=env, ray_cli=str(cli), start_attempts=2):
        pytest.fail("the head must not start")
    assert "timed out during startup" in str(err.value)
    assert len(os.listdir(marker)) == 2



# Holds the host's start lock (a path of the test's own) until told to let go, as another
# entry's head does while it starts; prints when it holds it and when it let go.
LOCK_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from slime.utils.external_utils.ray_head import start_turn
    with start_turn(Path(sys.argv[1]), timeout=60):
        print("holding", flush=True)
        while not Path(sys.argv[2]).exists():
            time.sleep(0.05)
        released = time.time()
    print(f"released {released!r}", flush=True)
""")

# A `ray` that notes when it was started, then is the real one.
TIMED_RAY = textwrap.dedent("""\
    #!{python}
    import os, sys, time
    with open({stamps!r}, "a") as fh:
        fh.write(f"{{time.time()!r}}\\n")
    os.execv({ray!r}, [{ray!r}, *sys.argv[1:]])
""")


def _timed_ray(tmp_path):
    from slime.utils.external_utils import ray_head as RH

    stamps = tmp_path / "ray-started"
    cli = tmp_path / "ray"
    cli.write_text(TIMED_RAY.format(python=sys.executable, stamps=str(stamps), ray=RH.ray_executable()))
    cli.chmod(0o755)
    return cli, stamps


def _hold_lock(tmp_path, lock):
    import subprocess

    go = tmp_path / "let-go"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(lock), str(go)],
                              env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "holding"
    return holder, go


def test_a_head_waits_for_the_host_start_lock_and_starts_after_it_is_released(tmp_path, capfd):
    """No `ray start` runs while another head of the host is starting (they starved each other)."""
    from slime.utils.external_utils import ray_head as RH

    lock = tmp_path / "start.lock"
    cli, stamps = _timed_ray(tmp_path)
    env = {**os.environ, "TMPDIR": str(tmp_path), RH.START_LOCK_VAR: str(lock)}
    env.pop("SLIME_CI_PORT_BASE", None)
    holder, go = _hold_lock(tmp_path, lock)
    threading.Timer(3.0, go.touch).start()
    try:
        with RH.private_head(num_gpus=0, env=env, ray_cli=str(cli)) as head:
            assert "Ray runtime started." in head.log_path.read_text()
    finally:
        go.touch()
        out, _ = holder.communicate(timeout=30)
    released = float(out.split("released ")[1])
    (started,) = map(float, stamps.read_text().split())
    assert started >= released, f"ray start ran {released - started:.2f} s before the lock was let go"
    assert "waiting for another Ray head on this host to finish starting" in capfd.readouterr().out


def test_a_start_lock_held_too_long_is_one_line_and_starts_nothing(tmp_path):
    from slime.utils.external_utils import ray_head as RH

    lock = tmp_path / "start.lock"
    cli, stamps = _timed_ray(tmp_path)
    env = {**os.environ, "TMPDIR": str(tmp_path), RH.START_LOCK_VAR: str(lock)}
    env.pop("SLIME_CI_PORT_BASE", None)
    holder, go = _hold_lock(tmp_path, lock)
    try:
        with pytest.raises(TimeoutError, match=r"another Ray head on this host has been starting for "
                                               r"over 2 s \(it holds .*start.lock\)"), \
                RH.private_head(num_gpus=0, env=env, ray_cli=str(cli), start_timeout=2.0):
            pytest.fail("the head must not start")
    finally:
        go.touch()
        holder.communicate(timeout=30)
    assert not stamps.exists(), "ray start ran while another head held the host's start lock"


def test_the_start_lock_of_a_killed_holder_is_free_at_once(tmp_path):
    import signal
    import time

    from slime.utils.external_utils import ray_head as RH

    lock = tmp_path / "start.lock"
    holder, _ = _hold_lock(tmp_path, lock)
    holder.send_signal(signal.SIGKILL)
    holder.communicate(timeout=10)
    t = time.monotonic()
    with RH.start_turn(lock, timeout=5) as waited:
        assert waited < 1.0
    assert time.monotonic() - t < 1.0
    assert int(lock.read_text()) == os.getpid()  # the holder's pid, for whoever looks


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
