"""The run command's stages, each called on its own, and the observers that watch a run.

A small repository in tmp_path (its own registry, real pytest files, a real SQLite
history); the run stage goes through the real runner and real subprocesses, and the
observer test through `main`, as `python -m ci run` calls it.
"""

import io
import json
import sqlite3
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import PASSING, code, write

from ci.errors import UsageError
from ci.gpu.ports import PORT_FLOOR
from ci.history.run_observer import (
    AttemptEnded,
    FirstOrder,
    Hints,
    Judgement,
    Observers,
    RunEnd,
    RunObserver,
    RunStart,
)
from ci.interrupts import PROCESS, Interrupts
from ci.log import Log
from ci.results import Result
from ci.run import pipeline
from ci.run.command import main, parse
from ci.run.timeline import TimelinePage

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
              exclude=("tests/e2e",), prefork=False),
        Suite(name="held", tier="cpu", purpose="p", profile="cpu", prefork=False, entries=(
            Entry(path="tests/test_ok.py"),
            Entry(path="tests/test_flaky.py", quarantine="flaky on purpose: #7"),
        )),
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", timeout=60, entries=(
            Entry(path="tests/e2e/test_step.py"),
        )),
        Suite(name="wide", tier="gpu", purpose="p", profile="e2e", timeout=60, entries=tuple(
            Entry(path="tests/e2e/test_step.py", test_args=("--layout", str(i))) for i in range(4)
        )),
    )
"""
# Fails on its first attempt in a checkout, passes on every one after.
FLAKY = code("""
    import pathlib
    NUM_GPUS = 0

    def test_passes_from_its_second_attempt():
        mark = pathlib.Path(__file__).with_name("flaky.ran")
        first = not mark.exists()
        mark.write_text("ran")
        assert not first, "the first attempt fails"
""")
STEP = """
    NUM_GPUS = 1

    if __name__ == "__main__":
        print("one step")
"""
OK, FLAKY_ID = "tests/test_ok.py", "tests/test_flaky.py"


@pytest.fixture
def repo(tmp_path):
    return write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY, OK: PASSING,
                                     FLAKY_ID: FLAKY, "tests/e2e/test_step.py": STEP})


@pytest.fixture
def log():
    return Log(actions=False, stream=io.StringIO())


class Recorder(RunObserver):
    """Writes down every hook call in order; its judge hook fails the entry named `veto`."""

    def __init__(self, veto: str = "") -> None:
        self.calls: list[tuple[str, object]] = []
        self.veto = veto

    def begin(self, start: RunStart) -> Hints:
        self.calls.append(("begin", start))
        return Hints()

    def attempt_ended(self, ended: AttemptEnded) -> None:
        self.calls.append(("attempt_ended", ended))

    def judge(self, judgement: Judgement) -> Judgement:
        self.calls.append(("judge", judgement))
        return judgement.amended(replace(r, outcome="failed", reason="vetoed by the recorder")
                                 if r.entry.id == self.veto else r for r in judgement.results)

    def run_ended(self, end: RunEnd) -> None:
        self.calls.append(("run_ended", end))

    def attempts(self) -> list[tuple[str, int, bool, str]]:
        return [(e.result.entry.id, e.attempt, e.retried, e.result.outcome)
                for name, e in self.calls if name == "attempt_ended" and isinstance(e, AttemptEnded)]


def _opts(root: Path, *args: str, suite: str = "unit"):
    return parse(["--suite", suite, "--root", str(root), "--history", "off", *args])


def _ready(root: Path, log: Log, *args: str, suite: str = "unit", hints: Hints | None = None):
    chosen = pipeline.select(_opts(root, *args, suite=suite), hints or Hints(), measured={})
    return pipeline.setup(chosen, log=log, env={}, infinite=False)


def _result(entry, outcome, **kw) -> Result:
    return Result(entry=entry, outcome=outcome, seconds=1.5, passed=int(outcome == "passed"),
                  failed=int(outcome == "failed"), reason=kw.pop("reason", ""), **kw)


def _ran(ready, outcomes: dict[str, str]) -> pipeline.Ran:
    results = tuple(_result(e, outcomes[e.id]) for e in ready.selection.entries)
    return pipeline.Ran(setup=ready, results=results, wall=3.0, gpu_rows=())


# --- select ---------------------------------------------------------------------------


def test_select_takes_the_suite_narrows_it_and_orders_by_durations_and_hints(repo):
    opts = _opts(repo)
    longest = pipeline.select(opts, Hints(), measured={OK: 1.0, FLAKY_ID: 5.0})
    assert [e.id for e in longest.entries] == [FLAKY_ID, OK]
    # The history's estimate beats what durations.json measured.
    estimated = pipeline.select(opts, Hints(estimates={OK: 9.0}), measured={OK: 1.0, FLAKY_ID: 5.0})
    assert [e.id for e in estimated.entries] == [OK, FLAKY_ID]
    assert estimated.estimates == {OK: 9.0}
    # What failed on this branch runs first, whatever it costs.
    first = Hints(first=FirstOrder(failed=frozenset({OK}), changed={}))
    assert [e.id for e in pipeline.select(opts, first, measured={FLAKY_ID: 5.0}).entries] == [OK, FLAKY_ID]
    only = pipeline.select(_opts(repo, "--only", "flaky"), Hints(), measured={})
    assert [e.id for e in only.entries] == [FLAKY_ID]


def test_a_fresh_clone_orders_by_the_committed_durations_until_it_measures(repo):
    opts = _opts(repo)
    assert [e.id for e in pipeline.select(opts, Hints(), measured={}).entries] == sorted([OK, FLAKY_ID])
    (repo / "tests" / "durations.json").write_text(json.dumps({OK: 40.0, FLAKY_ID: 2.0}))
    committed = pipeline.select(opts, Hints(), measured={})
    assert [e.id for e in committed.entries] == [OK, FLAKY_ID], "the committed seconds order a fresh clone"
    measured = pipeline.select(opts, Hints(), measured={FLAKY_ID: 90.0})
    assert [e.id for e in measured.entries] == [FLAKY_ID, OK], "what was measured here wins"
    (repo / ".slime-ci").mkdir()
    (repo / ".slime-ci" / "durations.json").write_text(json.dumps({FLAKY_ID: 50.0, OK: 1.0}))
    adopted = pipeline.select(opts, Hints(), measured={})
    assert [e.id for e in adopted.entries] == [FLAKY_ID, OK], "an adopter's .slime-ci/durations.json comes first"


def test_a_fresh_clone_s_gpu_entries_hold_expecting_the_committed_seconds(repo):
    # Without expectations the lock is strict FIFO: a fresh clone's narrow entries queued
    # behind a wide one could not borrow GPUs it leaves idle (`ci.gpu.allocator`).
    step = "tests/e2e/test_step.py"
    opts = _opts(repo, suite="train")
    assert pipeline.select(opts, Hints(), measured={}).expectations == {}
    (repo / "tests" / "durations.json").write_text(json.dumps({step: 80.0, OK: 3.0}))
    assert pipeline.select(opts, Hints(), measured={}).expectations == {step: 80.0}
    assert pipeline.select(opts, Hints(), measured={step: 95.0}).expectations == {step: 95.0}
    history = pipeline.select(opts, Hints(estimates={step: 120.0}), measured={step: 95.0})
    assert history.expectations == {step: 120.0}, "the history's p90 wins"
    # A CPU entry holds no GPU: nothing is expected of it.
    cpu = pipeline.select(_opts(repo), Hints(), measured={OK: 5.0, FLAKY_ID: 6.0})
    assert cpu.expectations == {}


def test_select_of_paths_outside_the_suite_is_one_usage_error(repo):
    with pytest.raises(UsageError, match="not a test of unit"):
        pipeline.select(_opts(repo, "tests/e2e/test_step.py"), Hints(), measured={})


# --- acquire (setup, the dry run, then what is held) ----------------------------------


def test_setup_decides_everything_and_holds_nothing(repo, log):
    ready = _ready(repo, log, "-j", "3")
    assert (ready.gpus, ready.gpu_run, ready.cfg.jobs, ready.cfg.infinite) == (0, False, 3, False)
    assert ready.junit == repo / ".ci-cache" / "junit" / "unit.xml"
    assert ready.durations == repo / ".ci-cache" / "durations.json"
    assert ready.cfg.backend.describe() == "local"
    assert not ready.cfg.work_dir.exists()
    pipeline.show(ready, log)
    shown = log.stream.getvalue().splitlines()
    assert shown[0] == "plan for unit: 2 entries, 3 at a time, 0 GPUs, local"
    assert sum("-m pytest tests/test_ok.py" in line for line in shown) == 1
    assert not ready.cfg.work_dir.exists()


def test_an_emulated_gpu_run_runs_no_more_entries_at_once_than_there_are_cores(repo, log, monkeypatch):
    # Emulated GPUs are CPU processes: four 2-GPU entries on 8 emulated GPUs would all start
    # at once, and on 2 cores the Ray head of the last one missed its start-up deadline.
    monkeypatch.setattr(pipeline.os, "cpu_count", lambda: 2)
    ready = _ready(repo, log, "--emulate-gpus", "--gpus", "8", suite="wide")
    assert (ready.gpu_run, ready.cfg.jobs) == (True, 2)
    pipeline.show(ready, log)
    assert log.stream.getvalue().splitlines()[0].startswith("plan for wide: 4 entries, 2 at a time, 8 GPUs")
    assert _ready(repo, log, "--emulate-gpus", "--gpus", "8", "-j", "3", suite="wide").cfg.jobs == 3
    # Real GPUs decide for themselves (the lock), CPU suites take every core.
    assert pipeline.default_jobs(4, gpu_run=True, emulated=False, cores=2) == 4
    assert pipeline.default_jobs(80, gpu_run=True, emulated=False, cores=2) == 64
    assert pipeline.default_jobs(4, gpu_run=True, emulated=True, cores=16) == 4
    assert pipeline.default_jobs(4, gpu_run=False, emulated=True, cores=3) == 3


def test_acquire_holds_the_ports_and_the_lock_of_an_emulated_gpu_run(repo, log):
    ready = _ready(repo, log, "--emulate-gpus", "--gpus", "2", suite="train")
    assert (ready.gpus, ready.gpu_run, ready.cfg.acquire) == (2, True, None)
    with pipeline.acquire(ready, interrupts=Interrupts()) as held:
        assert held.cfg.acquire is not None  # entries wait for their GPUs on the lock
        assert held.cfg.port_floor != PORT_FLOOR  # an emulated run's own port block
        assert held.cfg.work_dir.is_dir() and ready.junit.parent.is_dir()


def test_acquire_refuses_a_durations_store_that_is_a_directory_before_anything_runs(repo, log):
    (repo / "store").mkdir()
    ready = _ready(repo, log, "--durations", str(repo / "store"))
    with pytest.raises(UsageError, match="is not a file"), \
            pipeline.acquire(ready, interrupts=Interrupts()):
        pytest.fail("nothing may run")


# --- run ------------------------------------------------------------------------------


def test_run_goes_through_the_real_runner_and_tells_the_observer_each_attempt(repo, log):
    recorder = Recorder()
    ready = _ready(repo, log, "--retries", "1", "-j", "2")
    assert [e.id for e in ready.selection.entries] == [FLAKY_ID, OK]  # nothing measured: by id
    with pipeline.acquire(ready, interrupts=Interrupts()) as held:
        ran = pipeline.run(held, log=log, interrupts=Interrupts(), observer=recorder)
    assert [(r.entry.id, r.outcome, r.attempts) for r in ran.results] == [(FLAKY_ID, "flaky", 2),
                                                                          (OK, "passed", 1)]
    assert ran.wall > 0 and ran.gpu_rows == ()
    assert sorted(recorder.attempts()) == [(FLAKY_ID, 1, True, "failed"), (FLAKY_ID, 2, False, "passed"),
                                           (OK, 1, False, "passed")]
    assert log.stream.getvalue().startswith("unit: 2 entries, 2 at a time\n")


# --- judge ----------------------------------------------------------------------------


def test_judge_applies_the_hooks_in_registration_order(repo, log):
    ready = _ready(repo, log)
    ran = _ran(ready, {OK: "passed", FLAKY_ID: "passed"})

    class HideAll(RunObserver):
        def judge(self, judgement: Judgement) -> Judgement:
            return judgement.shown_as(replace(r, outcome="quarantined") for r in judgement.shown)

    judged = pipeline.judge(ran, observer=Observers([Recorder(veto=OK), HideAll()]))
    assert {r.entry.id: r.outcome for r in judged.judgement.results} == {OK: "failed", FLAKY_ID: "passed"}
    assert {r.outcome for r in judged.judgement.shown} == {"quarantined"}
    # The other way round, the veto comes last and is shown: amending shows what it amends.
    judged = pipeline.judge(ran, observer=Observers([HideAll(), Recorder(veto=OK)]))
    assert {r.entry.id: r.outcome for r in judged.judgement.shown} == {OK: "failed", FLAKY_ID: "passed"}


@pytest.mark.parametrize("include", [False, True])
def test_judge_with_the_registered_observers_quarantines_only_what_is_shown(repo, log, include):
    args = ("--include-quarantined",) if include else ()
    opts = _opts(repo, *args, suite="held")
    watch = Observers(pipeline.registered())
    start = pipeline.start(opts, log, {})
    ready = pipeline.setup(pipeline.select(opts, watch.begin(start), measured=start.measured),
                           log=log, env={}, infinite=False)
    judged = pipeline.judge(_ran(ready, {OK: "passed", FLAKY_ID: "failed"}), observer=watch)
    assert {r.entry.id: r.outcome for r in judged.judgement.results} == {OK: "passed", FLAKY_ID: "failed"}
    shown = {r.entry.id: r.outcome for r in judged.judgement.shown}
    assert shown == {OK: "passed", FLAKY_ID: "failed" if include else "quarantined"}
    assert pipeline.report(judged, log=log).exit_code == (1 if include else 0)


# --- report ---------------------------------------------------------------------------


def test_report_writes_junit_and_durations_of_what_is_shown_and_decides_the_exit_code(repo, log):
    ready = _ready(repo, log)
    judged = pipeline.judge(_ran(ready, {OK: "passed", FLAKY_ID: "failed"}), observer=Observers([]))
    reported = pipeline.report(judged, log=log)
    assert reported.exit_code == 1
    suites = ET.parse(ready.junit).getroot().findall("testsuite")
    assert sorted(s.get("name") for s in suites) == [FLAKY_ID, OK]
    assert json.loads(ready.durations.read_text()) == {OK: 1.5, FLAKY_ID: 1.5}
    out = log.stream.getvalue()
    assert f"FAILED {FLAKY_ID}: failed: " in out and "unit: 1 passed, 1 failed, 0 skipped" in out
    # A gate that names a metric its entry never writes: "fix the registry", exit 2.
    misdeclared = replace(judged, judgement=replace(judged.judgement, misdeclared=True))
    assert pipeline.report(misdeclared, log=log).exit_code == 2


# --- record ---------------------------------------------------------------------------


def test_record_tells_every_observer_the_end(repo, log):
    ready = _ready(repo, log)
    recorder = Recorder()
    recorder.begin(pipeline.start(ready.selection.opts, log, {}))
    judged = pipeline.judge(_ran(ready, {OK: "passed", FLAKY_ID: "passed"}), observer=recorder)
    end = pipeline.record(pipeline.Reported(judged=judged, exit_code=0), observer=recorder)
    assert recorder.calls[-1] == ("run_ended", end)
    assert (end.exit_code, end.backend, end.gpu_run, end.work_dir) == (0, "local", False, ready.cfg.work_dir)


def test_the_timeline_page_is_drawn_for_a_gpu_run_only(repo, log, tmp_path):
    page = TimelinePage()
    page.begin(pipeline.start(_opts(repo, suite="train"), log, {}))
    ready = _ready(repo, log, "--emulate-gpus", "--gpus", "1", suite="train")
    entry = ready.selection.entries[0]
    done = Judgement.of([_result(entry, "passed", devices=(0,), node="n", started_at=10.0, ended_at=12.0)])
    for gpu_run, out in ((False, tmp_path / "cpu"), (True, tmp_path / "gpu")):
        page.run_ended(RunEnd(judgement=done, exit_code=0, backend="local", gpu_run=gpu_run,
                              gpu_rows=("n:0",), work_dir=out))
    assert not (tmp_path / "cpu").exists()
    assert "tests/e2e/test_step.py" in (tmp_path / "gpu" / "timeline.html").read_text()
    assert f"timeline: {tmp_path / 'gpu' / 'timeline.html'}" in log.stream.getvalue()


# --- the observers, through main ------------------------------------------------------


@pytest.fixture
def signals():
    yield PROCESS
    PROCESS.restore()  # main takes SIGINT/SIGTERM for the process; give them back


def test_a_registered_observer_sees_begin_each_attempt_and_the_end_in_order(repo, signals, capsys,
                                                                             monkeypatch):
    for name in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "GITHUB_HEAD_REF", "GITHUB_REF_NAME"):
        monkeypatch.delenv(name, raising=False)
    url = f"sqlite:///{repo / 'history.sqlite'}"
    recorder = Recorder(veto=OK)
    code = main(["--suite", "unit", "--root", str(repo), "--retries", "1", "--history", url],
                observers=(*pipeline.registered(), recorder))
    out = capsys.readouterr().out
    names = [name for name, _ in recorder.calls]
    assert names == ["begin", "attempt_ended", "attempt_ended", "attempt_ended", "judge", "run_ended"], out
    attempts = recorder.attempts()
    assert sorted(attempts) == [(FLAKY_ID, 1, True, "failed"), (FLAKY_ID, 2, False, "passed"),
                                (OK, 1, False, "passed")]
    assert attempts.index((FLAKY_ID, 1, True, "failed")) < attempts.index((FLAKY_ID, 2, False, "passed"))
    judged = recorder.calls[-2][1]
    assert isinstance(judged, Judgement)  # the registered judges came first: nothing to amend here
    assert {r.entry.id: r.outcome for r in judged.results} == {OK: "passed", FLAKY_ID: "flaky"}
    end = recorder.calls[-1][1]
    assert isinstance(end, RunEnd) and end.exit_code == code == 1
    assert f"FAILED {OK}: failed: vetoed by the recorder" in out
    # The history records what the judges made of the results (the veto too), with the code.
    with sqlite3.connect(repo / "history.sqlite") as db:
        rows = db.execute("SELECT a.entry_id, a.attempt, a.outcome, r.exit_code FROM attempts a "
                          "JOIN runs r ON r.id = a.run_id ORDER BY a.entry_id, a.attempt").fetchall()
    assert rows == [(FLAKY_ID, 1, "failed", 1), (FLAKY_ID, 2, "flaky", 1), (OK, 1, "failed", 1)]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))


def test_runs_ending_together_each_keep_their_durations(tmp_path):
    """Eight processes merge their own keys into one store at the same moment (as the suites
    of `ci smoke` do): every key is there after, none lost to another's read-modify-write."""
    import os
    import subprocess

    store = tmp_path / "cache" / "durations.json"
    go = tmp_path / "go"
    writer = ("import os, sys, time, pathlib\n"
              "from ci.durations import DurationStore\n"
              "while not pathlib.Path(sys.argv[2]).exists(): time.sleep(0.001)\n"
              "for n in range(20):\n"
              "    DurationStore(pathlib.Path(sys.argv[1])).update({f'{sys.argv[3]}-{n}': n + 0.5})\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(store), str(go), f"w{i}"], env=env)
             for i in range(8)]
    go.touch()
    assert [p.wait(timeout=60) for p in procs] == [0] * 8
    data = json.loads(store.read_text())
    assert data == {f"w{i}-{n}": n + 0.5 for i in range(8) for n in range(20)}
    assert [p.name for p in store.parent.iterdir() if p.name.endswith(".tmp")] == []
