"""The runner on real test files in tmp_path, through the real CLI and real subprocesses."""

import io
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import PASSING, REPO, code, run_ci, write

from ci.log import Log
from ci.run.pipeline import _acquirer
from ci.run.runner import RunConfig, Runner
from ci.select.entries import ResolvedEntry

NUM_GPUS = 0



def _alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _run(root: Path, *args: str, env=None, timeout: float = 120):
    return run_ci("run", "--suite", "cpu_unit", "--root", str(root), *args, env=env, timeout=timeout)


def test_hanging_file_is_killed_with_everything_it_started(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    write(tmp_path, {"tests/test_hang.py": code(f"""
        import subprocess, sys, time, pytest
        NUM_GPUS = 0
        def test_hangs():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            open({str(pidfile)!r}, "w").write(str(child.pid))
            time.sleep(600)
    """)})
    proc = _run(tmp_path, "--timeout", "3")
    assert proc.returncode == 1
    assert "tests/test_hang.py" in proc.stdout and "timeout" in proc.stdout
    assert "timed out after 3s" in proc.stdout
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild), "a process the test started outlived its timeout"


def test_file_that_runs_no_test_fails(tmp_path):
    write(tmp_path, {"tests/test_ok.py": PASSING, "tests/test_nothing.py": code("""
        import pytest
        NUM_GPUS = 0
        def helper():
            return 1
    """)})
    proc = _run(tmp_path)
    assert proc.returncode == 1
    assert "tests/test_nothing.py: empty: ran no test" in proc.stdout
    assert "cpu_unit: 1 passed, 1 failed, 0 skipped" in proc.stdout.splitlines()


def test_import_error_is_shown_from_the_file(tmp_path):
    write(tmp_path, {"tests/test_dep.py": code("""
        import pytest
        import not_installed_anywhere_pkg
        NUM_GPUS = 0
        def test_a():
            assert True
    """)})
    proc = _run(tmp_path)
    assert proc.returncode == 1
    assert ("FAILED tests/test_dep.py: failed: ModuleNotFoundError: "
            "No module named 'not_installed_anywhere_pkg'") in proc.stdout
    assert "tests/test_dep.py:2: in <module>" in proc.stdout  # the file's own traceback line
    assert "ci/run/runner.py" not in proc.stdout + proc.stderr


def test_import_time_stubs_do_not_leak_between_files(tmp_path):
    write(tmp_path, {
        "tests/test_a_stubs.py": code("""
            import os, sys, types, pytest
            sys.modules["json"] = types.ModuleType("json")  # an import-time stub
            os.environ["LEAKED_BY_A"] = "1"
            NUM_GPUS = 0
            def test_stubbed():
                import json
                assert not hasattr(json, "dumps")
        """),
        "tests/test_b_real.py": code("""
            import os, pytest
            NUM_GPUS = 0
            def test_real_json():
                import json
                assert json.dumps([1]) == "[1]"
                assert "LEAKED_BY_A" not in os.environ
        """),
    })
    proc = _run(tmp_path, "-j", "1")
    assert proc.returncode == 0, proc.stdout
    assert "cpu_unit: 2 passed, 0 failed, 0 skipped" in proc.stdout.splitlines()


def test_files_run_in_parallel_and_report_merges(tmp_path):
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    # A rendezvous, not a stopwatch: each file announces itself and waits for the other,
    # which can only succeed when both run at once.
    body = code(f"""
        import os, time, pytest
        NUM_GPUS = 0
        def test_meets_the_other_file():
            me = os.path.basename(__file__)
            open(os.path.join({str(stamps)!r}, me), "w").close()
            deadline = time.time() + 60
            while len(os.listdir({str(stamps)!r})) < 2:
                assert time.time() < deadline, "the other file never ran alongside"
                time.sleep(0.05)
            time.sleep(1.0)
        def test_skipped():
            pytest.skip("on purpose")
    """)
    write(tmp_path, {"tests/test_p1.py": body, "tests/test_p2.py": body})
    junit = tmp_path / "merged.xml"
    durations = tmp_path / "durations.json"
    proc = _run(tmp_path, "-j", "2", "--junit", str(junit), "--durations", str(durations))
    assert proc.returncode == 0, proc.stdout
    assert sorted(p.name for p in stamps.iterdir()) == ["test_p1.py", "test_p2.py"]
    root = ET.parse(junit).getroot()
    suites = root.findall("testsuite")
    assert sorted(s.get("name") for s in suites) == ["tests/test_p1.py", "tests/test_p2.py"]
    assert sum(int(s.get("tests")) for s in suites) == 4
    assert sum(int(s.get("skipped")) for s in suites) == 2
    stored = json.loads(durations.read_text())
    assert set(stored) == {"tests/test_p1.py", "tests/test_p2.py"}
    assert all(v >= 1.0 for v in stored.values())
    assert "cpu_unit: 2 passed, 0 failed, 2 skipped" in proc.stdout.splitlines()
    # The table lists the slowest entry first and has a header.
    header = next(line for line in proc.stdout.splitlines() if line.startswith("entry"))
    assert header.split() == ["entry", "outcome", "passed", "failed", "skipped", "gpus", "seconds"]


def test_two_core_files_run_first_so_no_slot_idles_behind_them(tmp_path):
    # Longest first would be narrow1, wide, narrow2: `wide` (2 core slots of 2) then waits
    # for narrow1 with one slot idle, and narrow2 queues behind it, so the two narrow files
    # never meet. Wide files first, the two narrow ones run side by side afterwards.
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    narrow = code(f"""
        import os, time
        NUM_GPUS = 0
        def test_meets_the_other_narrow_file():
            open(os.path.join({str(stamps)!r}, os.path.basename(__file__)), "w").close()
            deadline = time.time() + 20
            while len([n for n in os.listdir({str(stamps)!r}) if n.startswith("test_n")]) < 2:
                assert time.time() < deadline, "the other narrow file never ran alongside"
                time.sleep(0.05)
    """)
    write(tmp_path, {
        "ci/registry/repo_suites.py": """
            from ci.registry import Entry, Suite
            SUITES = (
                Suite(name="unit", tier="cpu", purpose="p", profile="cpu",
                      entries=(Entry(path="tests/test_n1.py"), Entry(path="tests/test_wide.py", cores=2),
                               Entry(path="tests/test_n2.py"))),
            )
        """,
        "tests/test_n1.py": narrow, "tests/test_n2.py": narrow, "tests/test_wide.py": PASSING,
    })
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"tests/test_n1.py": 30.0, "tests/test_wide.py": 20.0,
                                     "tests/test_n2.py": 10.0}))
    plan = run_ci("run", "--suite", "unit", "--root", str(tmp_path), "-j", "2", "--dry-run",
                  "--durations", str(durations))
    listed = [line.split()[0] for line in plan.stdout.splitlines() if "run=" in line]
    assert listed == ["tests/test_wide.py", "tests/test_n1.py", "tests/test_n2.py"], plan.stdout
    proc = run_ci("run", "--suite", "unit", "--root", str(tmp_path), "-j", "2",
                  "--durations", str(durations))
    assert proc.returncode == 0, proc.stdout
    assert "unit: 3 passed, 0 failed, 0 skipped" in proc.stdout.splitlines()


def test_retry_that_passes_is_flaky_not_green(tmp_path):
    marker = tmp_path / "attempted"
    write(tmp_path, {"tests/test_flaky.py": code(f"""
        import os, pytest
        NUM_GPUS = 0
        def test_second_time_lucky():
            if not os.path.exists({str(marker)!r}):
                open({str(marker)!r}, "w").close()
                assert False, "first attempt fails"
    """)})
    proc = _run(tmp_path, "--retries", "2")
    assert proc.returncode == 0, proc.stdout
    assert "FLAKY" in proc.stdout
    assert "flaky: tests/test_flaky.py (failed 1 time(s), then passed)" in proc.stdout
    without = _run(tmp_path, "--retries", "0")  # the marker exists now: passes at once
    assert "FLAKY" not in without.stdout


def test_keyword_filter_and_nothing_matched(tmp_path):
    write(tmp_path, {"tests/test_a.py": PASSING, "tests/test_b.py": code("""
        import pytest
        NUM_GPUS = 0
        def test_special():
            assert True
    """)})
    proc = _run(tmp_path, "-k", "special")
    assert proc.returncode == 0, proc.stdout
    assert "cpu_unit: 1 passed, 0 failed, 0 skipped" in proc.stdout.splitlines()
    assert "deselected" in proc.stdout
    none = _run(tmp_path, "-k", "no_such_test_anywhere")
    assert none.returncode == 1
    assert "cpu_unit: no test ran" in none.stdout


def test_a_keyword_run_leaves_the_files_measured_durations(tmp_path):
    # A -k run times a part of each file; stored as the file's duration it would send a
    # 4-minute file to the back of the next longest-first plan (seen on slime's repository).
    write(tmp_path, {"tests/test_slow.py": code("""
        import time
        NUM_GPUS = 0
        def test_slow_part():
            time.sleep(2.0)
        def test_quick_part():
            assert True
    """)})
    durations = tmp_path / "durations.json"
    full = _run(tmp_path, "--durations", str(durations))
    assert full.returncode == 0, full.stdout
    measured = json.loads(durations.read_text())["tests/test_slow.py"]
    assert measured >= 2.0
    part = _run(tmp_path, "-k", "quick", "--durations", str(durations))
    assert part.returncode == 0, part.stdout
    assert "cpu_unit: 1 passed, 0 failed, 0 skipped" in part.stdout.splitlines()
    assert json.loads(durations.read_text()) == {"tests/test_slow.py": measured}


def test_github_actions_output(tmp_path):
    summary = tmp_path / "summary.md"
    write(tmp_path, {"tests/test_ok.py": PASSING, "tests/test_bad.py": code("""
        import pytest
        NUM_GPUS = 0
        def test_wrong():
            assert 1 == 2, "one is not two"
    """)})
    proc = _run(tmp_path, env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert proc.returncode == 1
    assert "::group::output of tests/test_bad.py" in proc.stdout
    assert "::endgroup::" in proc.stdout
    error = next(line for line in proc.stdout.splitlines() if line.startswith("::error "))
    assert error.startswith("::error file=tests/test_bad.py,title=tests/test_bad.py%3A failed::")
    text = summary.read_text()
    assert "| `tests/test_bad.py` | ❌ failed | 0 | 1 |" in text
    assert "| `tests/test_ok.py` | ✅ passed | 1 | 0 |" in text


def test_interrupt_ends_running_files_and_reports(tmp_path):
    pidfile = tmp_path / "child.pid"
    write(tmp_path, {"tests/test_long.py": code(f"""
        import os, time, pytest
        NUM_GPUS = 0
        def test_long():
            open({str(pidfile)!r}, "w").write(str(os.getpid()))
            time.sleep(600)
    """)})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "ci", "run", "--suite", "cpu_unit", "--root",
                             str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline, "the test file never started"
        time.sleep(0.05)
    child = int(pidfile.read_text())
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "interrupted" in out
    assert not _alive(child)


def test_script_entries_are_judged_by_exit_code(tmp_path):
    write(tmp_path, {
        "tests/e2e/test_good.py": "NUM_GPUS = 1\nprint('trained')\n",
        "tests/e2e/test_bad.py": "NUM_GPUS = 1\nraise SystemExit('loss did not fall')\n",
    })
    entries = [ResolvedEntry(id=p, path=p, timeout=30, num_gpus=1, kind="script")
               for p in ("tests/e2e/test_good.py", "tests/e2e/test_bad.py")]
    cfg = RunConfig(root=tmp_path, work_dir=tmp_path / "work", jobs=2)
    with open(os.devnull, "w") as sink:
        results = {r.entry.path: r for r in Runner(cfg, Log(actions=False, stream=sink)).run(entries)}
    good, bad = results["tests/e2e/test_good.py"], results["tests/e2e/test_bad.py"]
    assert (good.outcome, good.passed, good.returncode) == ("passed", 1, 0)
    assert (bad.outcome, bad.failed, bad.returncode) == ("failed", 1, 1)
    assert bad.reason == "loss did not fall"


def test_long_runs_print_what_is_still_running(tmp_path):
    write(tmp_path, {"tests/e2e/test_slow.py": "import time\nNUM_GPUS = 1\ntime.sleep(2)\n"})
    entry = ResolvedEntry(id="tests/e2e/test_slow.py", path="tests/e2e/test_slow.py", timeout=30,
                         num_gpus=1, kind="script")
    out = io.StringIO()
    runner = Runner(RunConfig(root=tmp_path, work_dir=tmp_path / "work", jobs=1),
                    Log(actions=False, stream=out))
    runner.heartbeat = 0.3
    [result] = runner.run([entry])
    assert result.outcome == "passed"
    assert "0/1 done; running: tests/e2e/test_slow.py (" in out.getvalue()


class _DepthRecorder(io.StringIO):
    """A log stream that notes how deep the stack is at every progress line."""

    def __init__(self) -> None:
        super().__init__()
        self.depths: list[int] = []

    def write(self, text: str) -> int:
        if text.startswith("["):
            depth, frame = 0, sys._getframe()
            while frame is not None:
                depth, frame = depth + 1, frame.f_back
            self.depths.append(depth)
        return len(text)  # nothing kept: thousands of lines


def test_infinite_run_is_a_loop_whose_stack_stays_flat(tmp_path):
    # A trivial entry (`true` stands in for the interpreter: the pass is the runner's work,
    # not the file's), repeated. The depth of the stack at every pass is the evidence: a
    # recursive loop grows it by at least a frame per pass, so a few hundred passes show it
    # (running past the recursion limit, 2,500 process starts, only took longer to say so).
    write(tmp_path, {"tests/e2e/test_trivial.py": "NUM_GPUS = 0\n"})
    entry = ResolvedEntry(id="tests/e2e/test_trivial.py", path="tests/e2e/test_trivial.py",
                         timeout=30, num_gpus=0, kind="script")
    passes = 300
    stream = _DepthRecorder()
    cfg = RunConfig(root=tmp_path, work_dir=tmp_path / "work", jobs=1, python="true",
                    infinite=True, max_passes=passes)
    [result] = Runner(cfg, Log(actions=False, stream=stream)).run([entry])
    assert result.outcome == "passed"
    assert len(stream.depths) == passes  # one progress line per pass, then the cap ended it
    # Passes report from inside the loop (the final one from the worker, a frame higher).
    looped = stream.depths[:-1]
    assert max(looped) == min(looped), "the stack grew from pass to pass"


def test_paths_dry_run_and_bad_input(tmp_path):
    write(tmp_path, {"tests/test_a.py": PASSING, "tests/utils/test_b.py": PASSING})
    dry = _run(tmp_path, "tests/utils", "--dry-run")
    assert dry.returncode == 0
    assert "plan for cpu_unit: 1 entries" in dry.stdout
    assert "tests/utils/test_b.py" in dry.stdout and "tests/test_a.py" not in dry.stdout
    assert "-m pytest tests/utils/test_b.py" in dry.stdout
    unknown = _run(tmp_path, "tests/test_zzz.py")
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == ("error: tests/test_zzz.py is not a test of cpu_unit; "
                                      "known: tests/test_a.py, tests/utils/test_b.py")
    for args, text in [(("-j", "0"), "-j 0: must be between 1 and 256"),
                       (("--timeout", "-5"), "--timeout -5: must be between 0 (exclusive)"),
                       (("--retries", "-1"), "--retries -1: must be between 0 and 10")]:
        bad = _run(tmp_path, *args)
        assert bad.returncode == 2, args
        assert text in bad.stderr and bad.stderr.count("\n") == 1
    suite = run_ci("run", "--suite", "nightly", "--root", str(tmp_path))
    assert suite.returncode == 2
    assert "unknown suite 'nightly'; known: cpu_unit, agent_adapter" in suite.stderr


def test_empty_gpu_suite_is_exit_3(tmp_path):
    write(tmp_path, {"tests/test_a.py": PASSING, "ci/registry/repo_suites.py": """
        from ci.registry import Suite

        SUITES = (
            Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",)),
            Suite(name="precision", tier="gpu", purpose="p", profile="e2e", label="run-ci-precision"),
        )
    """})
    proc = run_ci("run", "--suite", "precision", "--root", str(tmp_path), "--dry-run")
    assert proc.returncode == 3
    assert proc.stderr.startswith("error: nothing registered for precision")



class _SlowStream(io.StringIO):
    """A stream whose every write lets other threads run (as a pipe to a slow reader does)."""

    def write(self, s):
        time.sleep(0.0005)
        return super().write(s)


def test_lines_logged_from_many_threads_at_once_never_merge():
    import threading

    stream = _SlowStream()
    log = Log(actions=False, stream=stream)
    threads = [threading.Thread(target=lambda t=t: [log.line(f"[entry {t}] line {i}") for i in range(40)])
               for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    expected = sorted(f"[entry {t}] line {i}" for t in range(4) for i in range(40))
    assert sorted(stream.getvalue().splitlines()) == expected


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))


def test_gpu_entries_hold_their_gpus_expecting_what_the_run_expects(tmp_path):
    # The entry reads its GPU's holder record (the lock is advisory) while holding it.
    pattern = str(tmp_path / "locks" / "gpu_{gpu_id}.lock")
    (tmp_path / "locks").mkdir()
    script = ("import os\nNUM_GPUS = 1\nroot = os.environ['REC_DIR']\n"
              "gpu = os.environ['CUDA_VISIBLE_DEVICES'].split(',')[0]\n"
              "rec = open(os.path.join(root, 'locks', f'gpu_{gpu}.lock')).read()\n"
              "open(os.path.join(root, os.path.basename(__file__) + '.rec'), 'w').write(rec)\n")
    write(tmp_path, {"tests/e2e/test_known.py": script, "tests/e2e/test_new.py": script})
    entries = [ResolvedEntry(id=p, path=p, timeout=30, num_gpus=1, kind="script")
               for p in ("tests/e2e/test_known.py", "tests/e2e/test_new.py")]
    cfg = RunConfig(root=tmp_path, work_dir=tmp_path / "work", jobs=1,
                    acquire=_acquirer(2, pattern, 60), expectations={entries[0].id: 42.5},
                    base_env={**os.environ, "REC_DIR": str(tmp_path)})
    with open(os.devnull, "w") as sink:
        results = Runner(cfg, Log(actions=False, stream=sink)).run(entries)
    assert [r.outcome for r in results] == ["passed", "passed"], [r.reason for r in results]
    known = json.loads((tmp_path / "test_known.py.rec").read_text())
    new = json.loads((tmp_path / "test_new.py.rec").read_text())
    assert known["expect"] == 42.5 and known["command"] == "tests/e2e/test_known.py"
    assert new["expect"] is None  # nothing expected of it: it never backfills
