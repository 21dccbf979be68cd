"""`run --record-executed` records what Ray actors and multiprocessing children execute.

A Ray actor never exits cleanly: `ray.kill` ends it through the core worker's immediate
exit, with no atexit and no signal, so coverage's own write at exit never happens. Each
measured process therefore writes its data every fraction of a second
(`ci/run/coverage_flush.py`). One entry runs on emulated GPUs with a private Ray head on
loopback (slime's `private_head`) and starts two actors of one class:

- the recorded actor calls `only_in_actor`, then is killed at once, as slime's groups end
  theirs;
- the control actor has recording turned off in its process (`COVERAGE_PROCESS_START`
  emptied in its runtime_env) and calls `only_in_unrecorded_actor`: what the record would
  hold of an actor's code without the actor's own data;

and then runs `only_in_spawned` in a `multiprocessing` child (the spawn start method, whose
children leave through `os._exit`). A change to `only_in_actor` selects the entry, with
that function as the reason; a change to the control's function leaves it out.

Without Ray, a child the entry ends with SIGKILL one second (five writes) after it ran
`only_in_killed_child` shows the same bound in isolation: what a process ran at least one
interval before it was killed is in the record; and a child the entry starts with
`COVERAGE_PROCESS_START=""` runs `only_in_unrecorded_child`, which must not be: the rcfile
leaves out `patch = subprocess`, whose `COVERAGE_PROCESS_CONFIG` every descendant inherits
and coverage's `.pth` obeys even where `COVERAGE_PROCESS_START` was emptied.
"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ci import run_ci, write
from test_record_executed import RECORDS, checkout_with_slime, committed, plan_for, replace_in

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", label="run-ci-train",
              image="example/train:1", timeout=600, entries=(
            Entry(path="tests/e2e/test_actor.py"),
        )),
    )
"""

WORK = """
    import os

    def only_in_actor(x):
        return x * 3

    def only_in_unrecorded_actor(x):
        return x * 5

    def only_in_spawned(x):
        return x + 1

    def only_in_killed_child(x):
        return x - 1

    def only_in_unrecorded_child(x):
        return x - 2

    class Worker:
        def run(self, x):
            return only_in_actor(x)

        def run_unrecorded(self, x):
            return only_in_unrecorded_actor(x)

        def pid(self):
            return os.getpid()
"""

ENTRY = """
    import multiprocessing
    import os
    import sys
    import time

    import ray

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _work
    from slime.utils.external_utils.ray_head import private_head

    NUM_GPUS = 1

    def execute():
        here = os.path.dirname(os.path.abspath(__file__))
        path = {"PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
        worker = ray.remote(_work.Worker)
        with private_head(num_gpus=1, env=dict(os.environ)) as head:
            ray.init(address=head.gcs_address, log_to_driver=False)
            try:
                recorded = worker.options(runtime_env={"env_vars": path}).remote()
                control = worker.options(runtime_env={"env_vars": {
                    **path, "COVERAGE_PROCESS_START": ""}}).remote()
                assert ray.get(recorded.run.remote(2)) == 6
                assert ray.get(control.run_unrecorded.remote(2)) == 10
                assert os.getpid() not in ray.get([recorded.pid.remote(), control.pid.remote()])
                time.sleep(1.0)  # five of the flusher's intervals: a kill loses at most the last one
                ray.kill(recorded)
                ray.kill(control)
            finally:
                ray.shutdown()
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            assert pool.map(_work.only_in_spawned, [1]) == [2]

    if __name__ == "__main__":
        execute()
"""

KILLED = """
    import os
    import signal
    import subprocess
    import sys
    import time

    NUM_GPUS = 1
    CHILD = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); import _work; "
        "_work.only_in_killed_child(1); print('ran', flush=True); time.sleep(600)"
    )
    UNRECORDED = "import sys; sys.path.insert(0, sys.argv[1]); import _work; _work.only_in_unrecorded_child(1)"

    def execute():
        here = os.path.dirname(os.path.abspath(__file__))
        child = subprocess.Popen([sys.executable, "-c", CHILD, here], stdout=subprocess.PIPE)
        try:
            assert child.stdout.readline().strip() == b"ran"
            time.sleep(1.0)  # five of the flusher's intervals
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        assert child.returncode == -signal.SIGKILL
        off = {**os.environ, "COVERAGE_PROCESS_START": ""}  # recording turned off in this child
        subprocess.run([sys.executable, "-c", UNRECORDED, here], env=off, check=True)

    if __name__ == "__main__":
        execute()
"""

KILLED_REGISTRY = REGISTRY.replace("tests/e2e/test_actor.py", "tests/e2e/test_killed.py")
ENTRY_ID = "tests/e2e/test_actor.py"
WORK_PATH = "tests/e2e/_work.py"


@pytest.mark.slow
def test_a_function_a_sigkilled_child_ran_a_second_before_its_end_is_recorded(tmp_path):
    root = checkout_with_slime(tmp_path)
    for name in ("test_loads.py", "test_ranks.py", "_rank.py"):
        (root / "tests/e2e" / name).unlink()
    write(root, {"ci/registry/repo_suites.py": KILLED_REGISTRY, WORK_PATH: WORK,
                 "tests/e2e/test_killed.py": KILLED})
    committed(root)
    proc = run_ci("run", "--suite", "train", "--root", str(root), "--emulate-gpus", "--gpus", "1",
                  "--record-executed", timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    ran = json.loads((root / RECORDS).read_text())["entries"]["tests/e2e/test_killed.py"]["files"]
    assert "only_in_killed_child" in ran.get(WORK_PATH, ()), ran
    assert "only_in_actor" not in ran[WORK_PATH]
    assert "only_in_unrecorded_child" not in ran[WORK_PATH]  # COVERAGE_PROCESS_START="" is off


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = checkout_with_slime(tmp_path_factory.mktemp("actors"))
    for name in ("test_loads.py", "test_ranks.py", "_rank.py"):
        (root / "tests/e2e" / name).unlink()
    write(root, {"ci/registry/repo_suites.py": REGISTRY, WORK_PATH: WORK, ENTRY_ID: ENTRY})
    committed(root)
    proc = run_ci("run", "--suite", "train", "--root", str(root), "--emulate-gpus", "--gpus", "1",
                  "--record-executed", timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "executed code: 1 entry recorded" in proc.stdout
    return root


@pytest.fixture(scope="module")
def ran(repo):
    return json.loads((repo / RECORDS).read_text())["entries"][ENTRY_ID]["files"][WORK_PATH]


@pytest.mark.slow
def test_a_function_run_only_in_a_killed_ray_actor_is_recorded(ran):
    assert {"<module>", "only_in_actor", "Worker.run", "Worker.pid"} <= set(ran)


@pytest.mark.slow
def test_an_actor_with_recording_off_leaves_its_function_out(ran):
    assert "only_in_unrecorded_actor" not in ran and "Worker.run_unrecorded" not in ran


@pytest.mark.slow
def test_a_function_run_only_in_a_spawned_multiprocessing_child_is_recorded(ran):
    assert "only_in_spawned" in ran


@pytest.mark.slow
def test_changing_the_actor_only_function_selects_the_entry(repo):
    picked = plan_for(repo, "in-actor", replace_in(WORK_PATH, "return x * 3", "return x * 3 + 0"))
    [(entry, (runs, why))] = picked.items()
    assert entry == ENTRY_ID and runs and why.startswith(f"executes {WORK_PATH}:only_in_actor lines "), picked


@pytest.mark.slow
def test_changing_the_unrecorded_actors_function_leaves_the_entry_out(repo):
    picked = plan_for(repo, "in-control", replace_in(WORK_PATH, "return x * 5", "return x * 5 + 0"))
    assert picked == {ENTRY_ID: (False, "executes none of the changed code")}


FLUSHER_STOPS = """
import sys, threading, time
import coverage
sys.path.insert(0, sys.argv[1])
import coverage_flush
cov = coverage.Coverage(data_file=sys.argv[2])
cov.start()
coverage_flush.start(0.05)
time.sleep(0.3)
[flusher] = [t for t in threading.enumerate() if t.name == "slime-ci-coverage-flush"]
coverage_flush.stop()
flusher.join(2)
cov.stop()
cov.save()
print("stopped" if not flusher.is_alive() else "still running")
"""


def test_the_flusher_stops_before_the_process_exits(tmp_path):
    # At exit the flusher is stopped (threading's exit hook, before coverage's own write): a
    # daemon thread still writing while the interpreter tears down can crash the process.
    import subprocess

    from _ci import REPO

    done = subprocess.run([sys.executable, "-c", FLUSHER_STOPS, str(REPO / "ci/run"), str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
