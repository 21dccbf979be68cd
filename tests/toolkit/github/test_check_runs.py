"""One check run per suite, `slime-ci / <suite>`: conclusions from the blocking verdicts,
annotations at the failed assertion (from a real pytest JUnit report), the Checks API's caps,
and the sticky comment's links to them.

GitHub's API is the loopback stand-in of tests/toolkit/_github_api.py (this machine has no
GitHub): it refuses more than 50 annotations a request and a summary over 65,535 characters
with HTTP 422, as GitHub does, and records every check run. The store, the registry, the
command and pytest are the real ones.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import write
from _github_api import ANNOTATIONS_PER_REQUEST, SUMMARY_LIMIT, env_for, fake_github
from _verdict_store import attempt, plant_main, plant_pr, plant_push, registry, why_command

from ci.github.check_runs import MAX_ANNOTATIONS, junit_locations, read_junit
from ci.history.rows import AttemptRecord, RunRecord
from ci.history.store import open_store

NUM_GPUS = 0
# The planted test: its assertion is on line 6 (the helper it calls is in the same file).
FAILING = "import json\n\n\ndef helper(x):\n    return x + 1\n\n\ndef test_it():\n    value = helper(1)\n    assert value == 3, 'the PR broke it'\n"
ASSERT_LINE = 10


@pytest.fixture
def why(capsys, monkeypatch):
    return why_command(capsys, monkeypatch)


def _junit(root: Path, rel: str) -> Path:
    """Run pytest on the planted file as the runner does, and return the folder of its report."""
    out = root / ".ci-cache" / "runs" / "r1" / "junit"
    out.mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", rel,
                           f"--junitxml={out / 'x.xml'}"], cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return out


def _cpu_run(url: str, uid: str, commit: str, at: float, outcome: str, *, pr: int | None = None) -> None:
    path = "tests/test_cpu.py"
    a = AttemptRecord(entry_id=path, path=path, attempt=1, final=True, outcome=outcome, seconds=1.0,
                      reason="" if outcome == "passed" else "AssertionError: the PR broke it",
                      exit_code=0 if outcome == "passed" else 1)
    with open_store(url) as store:
        store.record(RunRecord(uid=uid, suite="cpu", commit=commit, branch="main" if pr is None else "feature",
                               event="push" if pr is None else "pull_request", hardware="cpu", started_at=at,
                               ended_at=at + 5, exit_code=0, trusted=pr is None, pr=pr, attempts=(a,)))


def test_the_assertions_line_is_read_from_a_real_pytest_report(tmp_path):
    root = write(tmp_path / "repo", {"tests/test_cpu.py": FAILING})
    where = read_junit(_junit(root, "tests/test_cpu.py"), root)
    assert where["tests/test_cpu.py"].line == ASSERT_LINE, where
    assert "the PR broke it" in where["tests/test_cpu.py"].message


def test_a_traceback_into_a_library_still_points_at_the_tests_own_frame():
    import xml.etree.ElementTree as ET

    doc = ET.fromstring(
        '<testsuites><testsuite><testcase classname="tests.unit.test_x" name="test_a" file="tests/unit/test_x.py" '
        'line="3"><failure message="ValueError: bad">tests/unit/test_x.py:7: in test_a\n    lib.f()\n'
        'slime/lib.py:40: in f\n    raise ValueError("bad")\nE   ValueError: bad\n\nslime/lib.py:40: ValueError'
        '</failure></testcase><testcase classname="tests.unit.test_y" name="test_b" line="9">'
        '<error message="boom"></error></testcase></testsuite></testsuites>')
    got = junit_locations(doc)
    assert (got["tests/unit/test_x.py"].path, got["tests/unit/test_x.py"].line) == ("tests/unit/test_x.py", 7)
    # No traceback: pytest's 0-based `line` of the test's def, made 1-based.
    assert (got["tests/unit/test_y.py"].path, got["tests/unit/test_y.py"].line) == ("tests/unit/test_y.py", 10)


def test_one_check_run_per_suite_with_its_conclusion_annotations_and_the_comments_links(tmp_path, why):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry(cpu=True),
                                     "tests/test_cpu.py": FAILING})
    plant_main(url)
    for n in range(1, 4):
        _cpu_run(url, f"cpu-main-{n}", f"m{n}" + "0" * 9, n * 100.0, "passed")
    commit = plant_push(url, 1)
    _cpu_run(url, "cpu-pr", commit, 1002.0, "failed", pr=42)
    junit = _junit(root, "tests/test_cpu.py")
    with fake_github() as (api, gh):
        proc = why(root, url, "--pr", "42", "--base", "m1000000000", "--checks", "--junit", str(junit),
                   "--head", "a" * 40, "--comment", "--gate", env=env_for(api))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        made = {r["name"]: r for r in gh.check_runs}
        [comment] = gh.comments[42]
    assert set(made) == {"slime-ci / cpu", "slime-ci / gpu"}, made.keys()
    assert all(r["head_sha"] == "a" * 40 and r["status"] == "completed" for r in made.values())
    assert made["slime-ci / cpu"]["conclusion"] == "failure"
    [note] = made["slime-ci / cpu"]["annotations"]
    assert (note["path"], note["start_line"], note["annotation_level"]) == ("tests/test_cpu.py", ASSERT_LINE,
                                                                            "failure"), note
    assert "new (rule new)" in note["message"] and "the PR broke it" in note["message"]
    gpu = made["slime-ci / gpu"]
    assert gpu["conclusion"] == "failure"  # `new` and `fresh` (unknown) block
    levels = {n["path"]: (n["annotation_level"], n["start_line"]) for n in gpu["annotations"]}
    # No report for these: the test file's first line, and only the blocking ones are failures.
    assert levels["tests/e2e/test_new.py"] == ("failure", 1)
    assert levels["tests/e2e/test_main.py"] == ("warning", 1)
    assert "| entry | verdict | evidence | reproduce |" in gpu["summary"]
    for name, r in made.items():
        assert f"[`{name}`]({r['html_url']})" in comment["body"], comment["body"]


def test_a_suite_with_only_non_blocking_failures_is_neutral_and_a_green_one_succeeds(tmp_path, why):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry(cpu=True)})
    plant_main(url)
    for n in range(1, 4):
        _cpu_run(url, f"cpu-main-{n}", f"m{n}" + "0" * 9, n * 100.0, "passed")
    plant_pr(url, [attempt("main", "failed", reason="AssertionError: broken on main"), attempt("ok", "passed")],
             pr=7, uid="pr-gpu")
    _cpu_run(url, "cpu-pr-7", "pxffffffff", 2001.0, "passed", pr=7)
    proc = why(root, url, "--pr", "7", "--checks", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    got = {r["name"]: r for r in json.loads(proc.stdout)}
    assert {n: r["conclusion"] for n, r in got.items()} == {"slime-ci / gpu": "neutral", "slime-ci / cpu": "success"}
    [note] = got["slime-ci / gpu"]["annotations"]
    assert (note["path"], note["line"], note["level"]) == ("tests/e2e/test_main.py", 1, "warning")
    assert "already failing on main" in note["message"]


def test_over_fifty_annotations_go_in_appending_updates_capped_with_a_line_saying_so(tmp_path, why):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry()})
    plant_main(url)
    many = MAX_ANNOTATIONS + 120
    plant_pr(url, [attempt(f"gen_{i:03d}", "failed", reason=f"AssertionError: {i} " + "x" * 300)
                   for i in range(many)], pr=11)
    with fake_github() as (api, gh):
        proc = why(root, url, "--pr", "11", "--checks", "--gate", env=env_for(api))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "not created" not in proc.stderr, proc.stderr
        [made] = gh.check_runs
        patches = [c for c in gh.calls if c[0] == "PATCH" and "/check-runs/" in c[1]]
    assert len(made["annotations"]) == MAX_ANNOTATIONS
    assert made["requests"] == MAX_ANNOTATIONS // ANNOTATIONS_PER_REQUEST == len(patches) + 1
    assert len(made["summary"]) <= SUMMARY_LIMIT
    assert f"{many - MAX_ANNOTATIONS} annotation(s) over {MAX_ANNOTATIONS} were left out" in made["summary"]
    assert "rows were left out at GitHub's limit of 65,535 characters" in made["summary"]


def test_a_run_by_id_prints_the_check_runs_it_would_create(tmp_path, why):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry()})
    plant_main(url)
    plant_push(url, 1)
    proc = why(root, url, "--run", "pr-1", "--checks", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    [run] = json.loads(proc.stdout)
    assert run["name"] == "slime-ci / gpu" and run["conclusion"] == "failure"
    paths = {a["path"] for a in run["annotations"]}
    assert paths == {f"tests/e2e/test_{e}.py" for e in ("new", "main", "fresh", "infra", "flaky")}, paths
    assert all(a["line"] == 1 and a["message"] for a in run["annotations"])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
