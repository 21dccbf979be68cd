"""Pre-imported workers (ci/backends/prefork.py): real runner, real forks, real process groups."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, code, run_ci, write

from ci.backends.prefork import BASE_PRELOAD, FRESH_ONLY, Policy, choose, pytest_args, startup_vars
from ci.log import Log
from ci.run.runner import RunConfig, Runner
from ci.select.entries import ResolvedEntry

NUM_GPUS = 0

PY = sys.executable
ARGV = [PY, "-m", "pytest", "tests/test_x.py", "-q"]


def _alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _gone(*pids: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _wait_for(path: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


def _run(root: Path, *args: str, timeout: float = 180):
    return run_ci("run", "--suite", "cpu_unit", "--root", str(root), *args, timeout=timeout)


# Records, from inside a test file, who forked it and what it inherited.
REPORT = """
    import os, sys, threading
    PRELOADED = "torch" in sys.modules  # read before this file imports anything heavy
    import pytest
    NUM_GPUS = 0

    def report(path):
        parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read().replace(b"\\0", b" ").decode()
        import random
        import numpy
        draws = f"{random.random()!r},{numpy.random.random()!r}"
        with open(path, "w") as fh:
            fh.write(f"{os.getpid()} {os.getppid()} {os.getpgid(0)} {PRELOADED} {draws} {parent}\\n")
"""


def test_nothing_one_file_does_reaches_the_next_file_of_the_same_worker(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write(tmp_path, {
        "tests/test_a_pollutes.py": code(REPORT + f"""
    import builtins, json, threading, time, types
    import numpy
    sys.modules["json"] = types.ModuleType("json")        # a stub planted at import time
    sys.modules["planted_by_a"] = types.ModuleType("planted_by_a")
    os.environ["LEAKED_BY_A"] = "1"
    os.chdir({str(elsewhere)!r})
    threading.Thread(target=time.sleep, args=(600,), daemon=True, name="left-by-a").start()
    numpy.LEAKED_BY_A = True                              # a global of a preloaded module
    builtins.LEAKED_BY_A = True

    def test_pollutes():
        report({str(out / "a")!r})
        assert threading.active_count() == 2
    """),
        "tests/test_b_checks.py": code(REPORT + f"""
    import builtins, threading
    import numpy

    def test_sees_a_clean_interpreter():
        report({str(out / "b")!r})
        import json
        assert json.dumps([1]) == "[1]"
        assert "planted_by_a" not in sys.modules
        assert "LEAKED_BY_A" not in os.environ
        assert os.getcwd() == {str(tmp_path)!r}
        assert [t.name for t in threading.enumerate()] == ["MainThread"]
        assert not hasattr(numpy, "LEAKED_BY_A")
        assert not hasattr(builtins, "LEAKED_BY_A")
        import tempfile
        assert tempfile.gettempdir() == os.environ["TMPDIR"]
    """),
    })
    proc = _run(tmp_path, "-j", "1")
    assert proc.returncode == 0, proc.stdout
    assert "cpu_unit: 2 passed, 0 failed, 0 skipped" in proc.stdout.splitlines()
    a_pid, a_parent, a_group, a_pre, a_draws, *a_cmd = (out / "a").read_text().split()
    b_pid, b_parent, b_group, b_pre, b_draws, *_ = (out / "b").read_text().split()
    # Both files were forked from one worker that had torch imported, each in its own group.
    assert a_parent == b_parent and a_pid != b_pid
    assert "ci/backends/prefork.py" in " ".join(a_cmd)
    assert (a_pre, b_pre) == ("True", "True")
    assert (a_group, b_group) == (a_pid, b_pid)
    # Each child seeds its generators anew, as a fresh interpreter does (random and numpy).
    assert all(x != y for x, y in zip(a_draws.split(","), b_draws.split(","), strict=True))


def test_timeout_kills_the_forked_files_whole_group(tmp_path):
    pidfile = tmp_path / "pids"
    write(tmp_path, {"tests/test_hang.py": code(REPORT + f"""
    import subprocess, time

    def test_hangs():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        report({str(pidfile)!r} + ".me")
        open({str(pidfile)!r}, "w").write(f"{{child.pid}}\\n")
        time.sleep(600)
    """)})
    proc = _run(tmp_path, "--timeout", "3")
    assert proc.returncode == 1
    assert "timed out after 3s" in proc.stdout
    me = (tmp_path / "pids.me").read_text().split()
    assert "ci/backends/prefork.py" in " ".join(me[5:]), "the file was not forked from a worker"
    grandchild = int(pidfile.read_text())
    assert _gone(grandchild, int(me[0]), int(me[1])), "the file, its child or the worker outlived the run"


# Threads of this process that a fork does not stop: forking once parks the pools that
# stop themselves at fork (OpenBLAS), as the gloo rank zygote does before it forks.
THREADS = """
    import os, sys
    import torch
    NUM_GPUS = 0

    def _lasting_threads():
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        return len(os.listdir("/proc/self/task"))

    LASTING = _lasting_threads()  # at import, as the zygote sees it when collection ends

    def test_starts_with_no_thread_a_fresh_interpreter_lacks():
        assert torch.get_num_threads() == 2, "OMP_NUM_THREADS not applied"
        assert LASTING == 1, f"{LASTING} threads survive a fork"
"""


@pytest.mark.parametrize("mode", [["-j", "1"], ["-j", "2"], ["--no-prefork"]])
def test_a_forked_file_has_the_threads_a_fresh_interpreter_has(tmp_path, mode):
    # Regression: the child called torch.set_num_threads(2), whose thread pool a fresh
    # interpreter never starts and which every fork brings back, so a one-slot run (two
    # threads per file on two cores) refused its gloo ranks the zygote.
    write(tmp_path, {"tests/test_threads.py": code(THREADS)})
    proc = run_ci("run", "--suite", "cpu_unit", "--root", str(tmp_path), *mode,
                  env={"OMP_NUM_THREADS": "2"}, timeout=180)
    assert proc.returncode == 0, proc.stdout
    assert "cpu_unit: 1 passed, 0 failed, 0 skipped" in proc.stdout.splitlines()


def test_file_that_runs_no_test_fails_and_k_selects(tmp_path):
    write(tmp_path, {
        "tests/test_empty.py": code("""
            import pytest
            NUM_GPUS = 0
            def helper():
                return 1
        """),
        "tests/test_pick.py": code("""
            import pytest
            NUM_GPUS = 0
            def test_special():
                assert True
            def test_other():
                assert True
        """),
    })
    proc = _run(tmp_path)
    assert proc.returncode == 1
    assert "tests/test_empty.py: empty: ran no test" in proc.stdout
    picked = _run(tmp_path, "-k", "special")
    assert picked.returncode == 0, picked.stdout
    assert "cpu_unit: 1 passed, 0 failed, 0 skipped" in picked.stdout.splitlines()


def test_files_that_spawn_their_own_processes_keep_working(tmp_path):
    write(tmp_path, {"tests/test_spawns.py": code("""
        import multiprocessing as mp
        import pytest
        NUM_GPUS = 0

        def square(q, x):
            q.put(x * x)

        @pytest.mark.parametrize("method", ["spawn", "forkserver"])
        def test_children_started_by_the_file(method):
            ctx = mp.get_context(method)
            q = ctx.Queue()
            p = ctx.Process(target=square, args=(q, 7))
            p.start()
            assert q.get(timeout=60) == 49
            p.join(60)
            assert p.exitcode == 0
    """)})
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert "cpu_unit: 2 passed, 0 failed, 0 skipped" in proc.stdout.splitlines()


def _start_runner(root: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "ci", "run", "--suite", "cpu_unit", "--root",
                             str(root)], env=env, stdout=subprocess.PIPE, text=True)


SLEEPER = """
    import subprocess, time

    def test_long():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        report({me!r})
        open({kid!r}, "w").write(f"{{child.pid}}\\n")
        time.sleep(600)
"""


def test_interrupt_ends_worker_and_file_and_exits_130(tmp_path):
    me, kid = tmp_path / "me", tmp_path / "kid"
    write(tmp_path, {"tests/test_long.py": code(REPORT + SLEEPER.format(me=str(me), kid=str(kid)))})
    proc = _start_runner(tmp_path)
    _wait_for(kid)
    pid, worker = (int(x) for x in _wait_for(me).split()[:2])
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "interrupted" in out
    assert _gone(pid, worker, int(kid.read_text()))


def test_runner_killed_by_sigkill_leaves_no_worker_and_no_file(tmp_path):
    me, kid = tmp_path / "me", tmp_path / "kid"
    write(tmp_path, {"tests/test_long.py": code(REPORT + SLEEPER.format(me=str(me), kid=str(kid)))})
    proc = _start_runner(tmp_path)
    try:
        _wait_for(kid)
        pid, worker = (int(x) for x in _wait_for(me).split()[:2])
        assert "ci/backends/prefork.py" in _cmdline(worker)
        proc.kill()
        proc.wait(30)
        assert _gone(worker, pid, int(kid.read_text())), "something outlived the runner"
    finally:
        proc.kill()
        proc.communicate()


def test_a_worker_with_a_thread_refuses_to_fork_and_the_file_runs_fresh(tmp_path):
    # A suite whose preload starts a thread: forking then would copy a half-held state,
    # so the worker refuses and the entry runs in a fresh interpreter, visibly.
    write(tmp_path, {
        "threadstarter.py": """
            import threading, time
            threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
        """,
        "ci/registry/repo_suites.py": """
            from ci.registry import Suite
            SUITES = (Suite(name="cpu_unit", tier="cpu", purpose="p", profile="cpu",
                            include=("tests",), preload=("threadstarter",)),)
        """,
        "tests/test_one.py": code(REPORT + f"""
    def test_one():
        report({str(tmp_path / "me")!r})
    """),
        # Enough files for one worker to take the suite's preload (four forks a worker).
        **{f"tests/test_more_{i}.py": code("NUM_GPUS = 0\ndef test_a():\n    pass\n") for i in range(3)},
    })
    proc = _run(tmp_path, "-j", "1")
    assert proc.returncode == 0, proc.stdout
    assert "pre-imported worker refused to fork (2 Python threads in the worker)" in proc.stdout
    assert "ci/backends/prefork.py" not in " ".join((tmp_path / "me").read_text().split()[5:])


def test_the_suite_s_preload_is_used_only_when_each_worker_forks_several_files(tmp_path):
    files = {f"tests/test_{i}.py": code("import pytest\nNUM_GPUS = 0\ndef test_a():\n    pass\n") for i in range(8)}
    write(tmp_path, {
        "ci/registry/repo_suites.py": """
            from ci.registry import Suite
            SUITES = (Suite(name="cpu_unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
                            preload=("json", "decimal")),)
        """,
        **files,
    })
    line = "  pytest files fork from pre-imported workers ({}) unless marked fresh"
    full = _run(tmp_path, "--dry-run", "-j", "2")  # 8 files on 2 workers: 4 forks each
    assert line.format("pytest, numpy, torch, json, decimal") in full.stdout.splitlines(), full.stdout
    few = _run(tmp_path, "--dry-run", "-j", "2", "tests/test_0.py", "tests/test_1.py", "tests/test_2.py")
    assert line.format("pytest, numpy, torch") in few.stdout.splitlines(), few.stdout


def test_dry_run_shows_how_each_entry_starts(tmp_path):
    write(tmp_path, {
        "ci/registry/repo_suites.py": """
            from ci.registry import Entry, Suite
            SUITES = (
                Suite(name="cpu_unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
                      entries=(Entry(path="tests/test_fresh.py", prefork=False),),
                      exclude=("tests/test_fresh.py", "tests/e2e")),
                Suite(name="megatron", tier="gpu", purpose="p", profile="e2e",
                      entries=(Entry(path="tests/e2e/test_train.py"),)),
            )
        """,
        "tests/test_forked.py": code("import pytest\nNUM_GPUS = 0\ndef test_a():\n    pass\n"),
        "tests/test_fresh.py": code("import pytest\nNUM_GPUS = 0\ndef test_a():\n    pass\n"),
        "tests/e2e/test_train.py": "NUM_GPUS = 1\nprint('trained')\n",
    })
    dry = _run(tmp_path, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert "  pytest files fork from pre-imported workers (pytest, numpy, torch) unless marked fresh" in lines
    assert any(line.startswith("  tests/test_forked.py ") and line.endswith("run=prefork") for line in lines)
    assert any(line.startswith("  tests/test_fresh.py ")
               and line.endswith("run=fresh (opted out in the registry)") for line in lines)
    off = _run(tmp_path, "--dry-run", "--no-prefork")
    assert "tests/test_forked.py  gpus=0  timeout=900s  run=fresh (--no-prefork)" in off.stdout
    gpu = run_ci("run", "--suite", "megatron", "--root", str(tmp_path), "--dry-run", "--emulate-gpus")
    assert gpu.returncode == 0, gpu.stderr
    assert "run=fresh (GPU suite: CUDA must never be initialised before a fork)" in gpu.stdout


def test_infinite_run_forks_every_pass_from_one_worker(tmp_path):
    passes = 12
    seen = tmp_path / "seen"
    write(tmp_path, {"tests/test_again.py": code(f"""
        import os, pytest
        NUM_GPUS = 0
        def test_again():
            with open({str(seen)!r}, "a") as fh:
                parent = open(f"/proc/{{os.getppid()}}/cmdline", "rb").read()
                fh.write(f"{{os.getpid()}} {{os.getppid()}} {{b'ci/backends/prefork.py' in parent}}\\n")
    """)})
    entry = ResolvedEntry(id="tests/test_again.py", path="tests/test_again.py", timeout=60,
                         num_gpus=0, kind="pytest")
    cfg = RunConfig(root=tmp_path, work_dir=tmp_path / "work", jobs=1, infinite=True,
                    max_passes=passes, prefork=Policy(preload=("pytest",)),
                    base_env={**os.environ, "PYTHONPATH": str(REPO)})
    with open(os.devnull, "w") as sink:
        [result] = Runner(cfg, Log(actions=False, stream=sink)).run([entry])
    assert result.outcome == "passed"
    rows = [line.split() for line in seen.read_text().splitlines()]
    assert len(rows) == passes
    assert len({pid for pid, _, _ in rows}) == passes  # a new child each pass
    [worker] = {parent for _, parent, _ in rows}  # all forked by the same worker
    assert {forked for _, _, forked in rows} == {"True"}
    assert _gone(int(worker)), "the worker outlived the run"


def _choose(**overrides):
    given = {"policy": Policy(), "kind": "pytest", "num_gpus": 0, "opted_in": True, "backend": "local",
             "may_fork": True, "argv": ARGV, "python": PY, "env": {"A": "1"}, "worker_env": {"A": "2"},
             "platform": "linux", **overrides}
    return choose(**given)


@pytest.mark.parametrize(("overrides", "why"), [
    ({"policy": FRESH_ONLY}, FRESH_ONLY.off),
    ({"platform": "win32"}, "no fork() on win32"),
    ({"platform": "darwin"}, "no fork() on darwin"),
    ({"kind": "script"}, "script entry: judged by its own exit code"),
    ({"num_gpus": 1}, "GPU entry: CUDA must never be initialised before a fork"),
    ({"opted_in": False}, "opted out in the registry"),
    ({"backend": "docker", "may_fork": False}, "runs on the docker backend"),
    ({"backend": "emulated", "may_fork": False}, "runs on the emulated backend"),
    ({"argv": [PY, "tests/test_x.py"]}, "not a `python -m pytest` command"),
    ({"env": {"PYTHONHASHSEED": "0"}}, "sets PYTHONHASHSEED, read when an interpreter starts"),
    ({"env": {"OMP_NUM_THREADS": "4"}, "worker_env": {"OMP_NUM_THREADS": "1"}},
     "sets OMP_NUM_THREADS, read when an interpreter starts"),
])
def test_fallback_reasons(overrides, why):
    choice = _choose(**overrides)
    assert (choice.mode, choice.why) == ("fresh", why)
    assert choice.describe() == f"fresh ({why})"


def test_prefork_choice_and_helpers():
    assert _choose().mode == "prefork"  # variables no interpreter reads at start may differ
    assert _choose(env={"PYTHONUNBUFFERED": "1", "TMPDIR": "/x"}).describe() == "prefork"
    assert pytest_args(ARGV, PY) == ["tests/test_x.py", "-q"]
    assert pytest_args(["/other/python", *ARGV[1:]], PY) is None
    assert startup_vars({"LD_PRELOAD": "x", "HOME": "/", "MKL_NUM_THREADS": "2"}) == {
        "LD_PRELOAD": "x", "MKL_NUM_THREADS": "2"}
    assert BASE_PRELOAD == ("pytest", "numpy", "torch")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
