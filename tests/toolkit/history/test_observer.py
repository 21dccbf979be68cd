"""The run history through real `python -m ci run` invocations of a small emulated-GPU suite.

Each entry is a script on 1 logical GPU whose behaviour a file in the test's tmp dir plants:
a learner writing metrics.jsonl (its learning rate planted), a coin that fails when told,
and a quarantined entry. Recording, spooling when the store is unreachable, the durations
migration, metric gates, flake quarantine and the failure monitor are checked end to end.
"""

import json
import os
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, run_ci, write

from ci.history import schema
from ci.history.store import open_store
from ci.registry.model import MONITOR_BISECT_PLAN

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, MetricGate, Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
              exclude=("tests/e2e",)),
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", timeout=60,
              quarantine_rate=0.3, quarantine_min_runs=3, entries=(
            Entry(path="tests/e2e/test_learn.py", gates=(
                MetricGate(metric="reward", steps="last", rule="sigma", k=3.0, floor=0.02),
                MetricGate(metric="kl", steps="all", rule="absolute", high=0.5),
            )),
            Entry(path="tests/e2e/test_coin.py"),
        )),
        Suite(name="typo", tier="gpu", purpose="p", profile="e2e", timeout=60, entries=(
            Entry(path="tests/e2e/test_learn.py", gates=(MetricGate(metric="rewrad"),)),
        )),
        Suite(name="held", tier="gpu", purpose="p", profile="e2e", timeout=60, entries=(
            Entry(path="tests/e2e/test_coin.py", quarantine="fails on a cold cache: see #101"),
        )),
    )
"""

# Reward climbs with the planted learning rate; the entry's own check only asks that it
# climbs at all, so a halved learning rate passes it (and the gate must catch it).
LEARN = """
    import json, os, pathlib
    NUM_GPUS = 1

    def execute():
        lr = float(pathlib.Path(os.environ["PLANT"], "lr").read_text())
        noise = float(pathlib.Path(os.environ["PLANT"], "noise").read_text())
        out = pathlib.Path(os.environ["SLIME_CI_OUTPUT_DIR"], "run")
        out.mkdir(parents=True, exist_ok=True)
        rows = [{"step": s, "reward": 0.2 + lr * 0.1 * s + noise, "kl": 0.01 * s, "engines": []}
                for s in range(5)]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
        assert rows[-1]["reward"] > rows[0]["reward"], "reward did not climb"

    if __name__ == "__main__":
        execute()
"""

COIN = """
    import os, pathlib
    NUM_GPUS = 1

    def execute():
        plan = pathlib.Path(os.environ["PLANT"], "coin")
        todo = plan.read_text().split() if plan.exists() else []
        if todo:  # one outcome per attempt: "fail" or "pass"
            plan.write_text(" ".join(todo[1:]))
            if todo[0] == "fail":
                raise SystemExit("coin came up tails")

    if __name__ == "__main__":
        execute()
"""


@pytest.fixture
def repo(tmp_path):
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY, "tests/e2e/test_learn.py": LEARN,
                                     "tests/e2e/test_coin.py": COIN})
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "lr").write_text("1.0")
    (plant / "noise").write_text("0.0")
    return root, plant


def _train(repo, *args, suite="train", env=None, history=None):
    root, plant = repo
    url = history or f"sqlite:///{root / '.ci-cache' / 'history.sqlite'}"
    return run_ci("run", "--suite", suite, "--root", str(root), "--emulate-gpus", "--gpus", "2",
                  "--history", url, *args, env={"PLANT": str(plant), **(env or {})}, timeout=120)


def _db(repo):
    return sqlite3.connect(repo[0] / ".ci-cache" / "history.sqlite")


def test_an_unreachable_store_warns_once_keeps_junit_and_the_next_run_writes_it(repo):
    root, _ = repo
    down = _train(repo, history="postgresql://slime@127.0.0.1:1/history")
    assert down.returncode == 0, down.stdout + down.stderr
    said = [line for line in down.stdout.splitlines() if "127.0.0.1" in line]
    assert len(said) == 1 and said[0].startswith("warning: history: unavailable"), down.stdout
    assert "warning: history: not recorded (the same problem); kept in" in down.stdout
    assert (root / ".ci-cache/junit/train.xml").is_file()
    assert set(json.loads((root / ".ci-cache/durations.json").read_text())) == {
        "tests/e2e/test_learn.py", "tests/e2e/test_coin.py"}
    spooled = list((root / ".ci-cache/history-pending").glob("*.json"))
    assert len(spooled) == 1
    up = _train(repo)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "(+1 spooled)" in up.stdout
    assert list((root / ".ci-cache/history-pending").glob("*.json")) == []
    with _db(repo) as db:
        runs = db.execute("select event, backend from runs order by started_at").fetchall()
        # The durations.json the first run left, imported into the new store; then both runs.
        assert [r[0] for r in runs] == ["import", "local", "local"]
        assert db.execute("select count(*) from metrics").fetchone()[0] == 2 * 5 * 2  # reward, kl


def test_a_corrupt_sqlite_store_never_fails_the_run_and_is_left_as_it_was(repo):
    root, _ = repo
    db = root / ".ci-cache" / "history.sqlite"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"garbage" * 1000)
    proc = _train(repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert db.read_bytes() == b"garbage" * 1000
    assert sum("is not a SQLite database" in line for line in proc.stdout.splitlines()) == 1
    assert len(list((root / ".ci-cache/history-pending").glob("*.json"))) == 1


def test_a_metric_gate_catches_a_halved_learning_rate_the_entry_lets_through(repo):
    _, plant = repo
    first = _train(repo)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "metric gate reward (tests/e2e/test_learn.py): inactive, 0 trusted run(s) on emulated " \
           "(needs 3)" in first.stdout
    for noise in ("0.01", "-0.01"):
        (plant / "noise").write_text(noise)
        assert _train(repo).returncode == 0
    (plant / "noise").write_text("0.0")
    (plant / "lr").write_text("0.5")
    bad = _train(repo)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    line = next(x for x in bad.stdout.splitlines() if x.startswith("FAILED tests/e2e/test_learn.py"))
    assert line == ("FAILED tests/e2e/test_learn.py: failed: metric gate: reward at step 4 = 0.4, "
                    "baseline 0.6 ± 0.01 (n=3, emulated; allowed 3σ, floor 0.02)")
    (plant / "lr").write_text("1.0")
    assert _train(repo).returncode == 0, "the same run without the regression passes the gate"
    # CUDA runs never see emulated baselines: on "cuda" the gate has no history yet.
    cuda = _train(repo, env={"SLIME_CI_HARDWARE": "cuda"})
    assert cuda.returncode == 0 and "inactive, 0 trusted run(s) on cuda" in cuda.stdout


def test_a_gate_naming_a_metric_the_run_never_wrote_is_exit_2_with_one_line(repo):
    proc = _train(repo, suite="typo")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("FAILED tests/e2e/test_learn.py: failed: metric gate: tests/e2e/test_learn.py wrote no "
            "metric 'rewrad'; fix its gate in ci/registry/repo_suites.py") in proc.stdout.splitlines()


def test_a_planted_flake_is_measured_then_quarantined_and_can_gate_again(repo):
    root, plant = repo
    for _ in range(3):  # fails, then passes on its retry: a flake each time
        (plant / "coin").write_text("fail pass")
        assert _train(repo, "--retries", "1").returncode == 0
    flaky = run_ci("history", "flaky", "--root", str(root), "--history",
                   f"sqlite:///{root / '.ci-cache/history.sqlite'}")
    assert flaky.returncode == 0, flaky.stderr
    row = next(x for x in flaky.stdout.splitlines() if x.startswith("tests/e2e/test_coin.py"))
    assert row.split()[1:6] == ["100%", "3", "3", "0", "3"], flaky.stdout
    # Now above the suite's 30 %: it runs, fails, is reported QUARANTINED, and the job passes.
    (plant / "coin").write_text("fail")
    held = _train(repo)
    assert held.returncode == 0, held.stdout + held.stderr
    assert any(x.split()[:2] == ["tests/e2e/test_coin.py", "QUARANTINED"] for x in held.stdout.splitlines())
    assert ("QUARANTINED tests/e2e/test_coin.py: QUARANTINED (flake rate 100% (3 of 3 runs) is above 30%); "
            "it failed: coin came up tails") in held.stdout
    case = ET.parse(root / ".ci-cache/junit/train.xml").getroot().find(".//testcase[skipped]")
    assert case is not None and case.get("name") == "tests/e2e/test_coin.py [QUARANTINED]"
    assert case.find("skipped").get("type") == "quarantined"
    (plant / "coin").write_text("fail")
    gating = _train(repo, "--include-quarantined")
    assert gating.returncode == 1 and "FAILED tests/e2e/test_coin.py: failed: coin came up tails" in gating.stdout


def test_a_registry_quarantine_reports_its_reason(repo):
    _, plant = repo
    (plant / "coin").write_text("fail")
    proc = _train(repo, suite="held")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "QUARANTINED (fails on a cold cache: see #101); it failed: coin came up tails" in proc.stdout


def test_the_monitor_reports_three_consecutive_failures_on_main_with_the_range(repo, tmp_path):
    root, plant = repo
    url = f"sqlite:///{root / '.ci-cache/history.sqlite'}"
    for n, outcome in enumerate(["pass", "pass", "fail", "fail", "fail"]):
        (plant / "coin").write_text(outcome)
        env = {"GITHUB_REF_NAME": "main", "GITHUB_SHA": f"{n:x}" * 40, "GITHUB_EVENT_NAME": "schedule"}
        _train(repo, "--only", "test_coin", env=env)
    out = tmp_path / "monitor.md"
    mon = run_ci("history", "monitor", "--root", str(root), "--history", url, "--out", str(out),
                 env={"GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")})
    assert mon.returncode == 1, mon.stdout + mon.stderr
    lines = mon.stdout.splitlines()
    assert lines[0] == "monitor: 1 entry failed 3+ consecutive runs on main"
    assert lines[1].startswith("  train: tests/e2e/test_coin.py: 3 failures since ")
    assert lines[1].endswith(f"bisect {'1' * 12}..{'2' * 12}")
    assert lines[2] == "      coin came up tails"
    assert f"`{'1' * 12}` | `{'2' * 12}` | coin came up tails |" in out.read_text()
    assert (tmp_path / "summary.md").read_text() == out.read_text()
    quiet = run_ci("history", "monitor", "-k", "4", "--root", str(root), "--history", url)
    assert quiet.returncode == 0 and quiet.stdout.strip() == "monitor: no entry failed 4 consecutive runs on main"


def _monitor_job_command():
    """The generated monitor job's session step, and the command that session runs."""
    from ci.github.job_plan import table
    from ci.github.workflow import WORKFLOW_PATH, render
    from ci.registry import MONITOR_REPORT
    from ci.registry.repo_suites import SESSIONS

    job = yaml.safe_load(render(table())[WORKFLOW_PATH])["jobs"]["monitor"]
    assert job["environment"] == {"name": "ci-history", "deployment": False}
    (step,) = [s for s in job["steps"] if s.get("run", "").startswith("nox -s ")]
    assert step["run"] == "nox -s monitor"
    # The store's secret, and the job's token for the issues of held entries (ci/github/flaky_issues.py).
    assert step["env"] == {"SLIME_CI_HISTORY_URL": "${{ secrets.SLIME_CI_HISTORY_URL }}",
                           "GITHUB_TOKEN": "${{ github.token }}"}
    (upload,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload["if"] == "always()" and upload["with"]["path"] == MONITOR_REPORT
    (session,) = [x for x in SESSIONS if x.name == "monitor"]
    # What `nox -s monitor` runs in its venv: the issues, the leak audit's issues, then the monitor.
    issues, leaks, command = session.commands
    assert issues[:4] == ("python", "-m", "ci", "issues")
    assert leaks[:5] == ("python", "-m", "ci", "select-audit", "--issues")
    assert command[0] == "python"
    return [sys.executable, *command[1:]], MONITOR_REPORT


def test_the_scheduled_monitor_job_reports_three_failures_and_passes_on_an_unreachable_store(repo, tmp_path):
    root, plant = repo
    for n, outcome in enumerate(["pass", "fail", "fail", "fail"]):
        (plant / "coin").write_text(outcome)
        env = {"GITHUB_REF_NAME": "main", "GITHUB_SHA": f"{n + 5:x}" * 40, "GITHUB_EVENT_NAME": "schedule"}
        assert _train(repo, "--only", "test_coin", env=env).returncode == 1 - (outcome == "pass")
    command, report = _monitor_job_command()
    summary = tmp_path / "summary.md"
    base = {**os.environ, "PYTHONPATH": str(REPO), "GITHUB_STEP_SUMMARY": str(summary)}
    base.pop("SLIME_CI_HISTORY_URL", None)

    def job(url):
        env = {**base, **({"SLIME_CI_HISTORY_URL": url} if url is not None else {})}
        return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=120,
                              check=False)

    found = job(f"sqlite:///{root / '.ci-cache/history.sqlite'}")
    assert found.returncode == 1, found.stdout + found.stderr  # entries failing: the job fails, the alert
    assert found.stdout.splitlines()[0] == "monitor: 1 entry failed 3+ consecutive runs on main"
    text = (root / report).read_text()
    assert "| train | `tests/e2e/test_coin.py` | 3 |" in text
    assert f"`{'5' * 12}` | `{'6' * 12}` | coin came up tails |" in text  # the range to bisect
    assert summary.read_text() == text
    # The streak has no bisect answer yet: the plan asks the next step to dispatch one.
    plan = root / MONITOR_BISECT_PLAN
    assert [json.loads(x) for x in plan.read_text().splitlines()] == [
        {"entry": "tests/e2e/test_coin.py", "suite": "train", "tier": "gpu"}]
    with open_store(f"sqlite:///{root / '.ci-cache/history.sqlite'}") as store, store.engine.begin() as conn:
        conn.execute(schema.bisects.insert().values(
            uid="b1", suite="train", entry_id="tests/e2e/test_coin.py", good="5" * 40, bad="6" * 40,
            kind="first-bad", commit="6" * 40, candidates="6" * 40, confidence=1.0,
            attempts_per_commit=1, width=1, rounds=2, steps=2, trigger="monitor", started_at=1.0,
            ended_at=2.0, summary="first bad commit: 666"))
    again = job(f"sqlite:///{root / '.ci-cache/history.sqlite'}")
    assert again.returncode == 1 and plan.read_text() == "", "a streak with an answer is not bisected again"
    (root / report).unlink()
    down = job("postgresql://ci@127.0.0.1:9/history")  # port 9: nothing listens
    assert down.returncode == 0 and down.stdout == "", down.stdout + down.stderr
    (line,) = down.stderr.splitlines()
    assert line.startswith("monitor: skipped, the history store cannot be used") and "127.0.0.1" in line
    assert not (root / report).exists()
    empty = tmp_path / "fresh"
    empty.mkdir()
    none = subprocess.run(command, cwd=empty, env=base, capture_output=True, text=True, timeout=120,
                          check=False)
    assert none.returncode == 0, none.stdout + none.stderr
    assert none.stderr.strip() == ("monitor: no history store to read; set SLIME_CI_HISTORY_URL "
                                   "(the ci-history environment's secret) to the shared store's URL")
    assert not (empty / ".ci-cache").exists()  # nothing half-written


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
