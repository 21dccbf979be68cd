"""A CPU job's failures get verdicts like a GPU job's: through the real path a PR's run takes.

Each of the two jobs (one of main, one of PR #12) is real: `python -m ci run` on a CPU suite, then its last step `history record
--export`, then the ingest of that export under a `workflow_run` event written here
(GitHub's own cannot exist in a test), on a SQLite file and on the real PostgreSQL server;
then `python -m ci why`. A failure main does not have is `new`; one main has is `already
failing on main`. The check runs the verdict job would create annotate each failure at its
assertion's line, which the run read from its own JUnit report and the history carried through
the export and the ingest (the verdict job has no report), and each verdict names the Actions
run and attempt that the ingest's event gave.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import PASSING, run_ci, write
from _github_api import env_for, fake_github

NUM_GPUS = 0
pytestmark = pytest.mark.slow  # two jobs of real CLI runs per store: ~15 s when the CPU is free

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="e2e", entries=(
            Entry(path="tests/test_a.py"), Entry(path="tests/test_b.py"))),
    )
"""
FAILING = "NUM_GPUS = 0\n\n\ndef test_it():\n    assert 1 + 1 == 3, 'planted'\n"
ASSERT_LINE = 5  # of FAILING


def _job(tmp: Path, name: str, files: dict[str, str], env: dict[str, str]) -> Path:
    """One CPU job: the session, then its record step exporting its runs; the export folder."""
    root = write(tmp / name, {"ci/registry/repo_suites.py": REGISTRY, **files})
    clean = {k: "" for k in os.environ if k.startswith("GITHUB_")}
    job_env = {**clean, "SLIME_CI_HISTORY_URL": "", "GITHUB_JOB": "unit_job", "GITHUB_RUN_ID": "77", **env}
    ran = run_ci("run", "--suite", "unit", "--root", str(root), "--no-prefork", "--no-docker", env=job_env)
    assert ran.returncode in (0, 1), ran.stdout + ran.stderr
    step = run_ci("history", "record", "--root", str(root), "--suite", "unit", "--status",
                  "success" if ran.returncode == 0 else "failure", "--export", ".ci-cache/history-export",
                  env=job_env)
    assert step.returncode == 0 and "exported 1 run(s)" in step.stdout, step.stdout + step.stderr
    return root / ".ci-cache/history-export"


def _checkout(tmp: Path) -> tuple[Path, str]:
    """The ingest job's checkout: a real repository whose `main` holds main's commit."""
    repo = tmp / "checkout"
    for argv in (["init", "-q", "-b", "main", str(repo)],
                 ["-C", str(repo), "-c", "user.name=ci", "-c", "user.email=ci@localhost",
                  "commit", "-q", "--allow-empty", "-m", "main's commit"]):
        subprocess.run(["git", *argv], check=True, capture_output=True)
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                         text=True).stdout.strip()
    return repo, sha


def _ingest(export: Path, url: str, tmp: Path, *, pr: int | None, checkout: Path, sha: str) -> None:
    event = {"workflow_run": {"id": 900 + (pr or 0), "path": ".github/workflows/pr-test.yml", "head_sha": sha,
                              "event": "pull_request" if pr else "push", "run_attempt": 2, "head_branch": "feature" if pr else "main",
                              "head_repository": {"full_name": "o/r"},
                              "pull_requests": [{"number": pr}] if pr else [], "display_title": "t"},
             "repository": {"full_name": "o/r", "default_branch": "main"}}
    path = tmp / "event.json"
    path.write_text(json.dumps(event))
    env = {k: "" for k in os.environ if k.startswith("GITHUB_")} | {"SLIME_CI_HISTORY_URL": "",
                                                                     "GITHUB_OUTPUT": str(tmp / "out")}
    done = run_ci("history", "ingest", str(export), "--event-file", str(path), "--history", url,
                  "--root", str(checkout), env=env)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_cpu_jobs_new_failure_is_new_and_one_main_has_is_already_failing(store_url, tmp_path):
    main = {"GITHUB_REF_NAME": "main", "GITHUB_EVENT_NAME": "push"}
    # main's last run: test_a passes, test_b fails. Its commit is on main (the ingest checks).
    checkout, sha = _checkout(tmp_path)
    export = _job(tmp_path, "main", {"tests/test_a.py": PASSING, "tests/test_b.py": FAILING},
                  {**main, "GITHUB_SHA": sha})
    _ingest(export, store_url, tmp_path, pr=None, checkout=checkout, sha=sha)
    pr = {"GITHUB_HEAD_REF": "feature", "GITHUB_EVENT_NAME": "pull_request", "GITHUB_SHA": "f" * 40}
    export = _job(tmp_path, "pr", {"tests/test_a.py": FAILING, "tests/test_b.py": FAILING}, pr)
    laptop = export.parents[1]  # the PR job's checkout: its own store holds the run, as a laptop's would
    _ingest(export, store_url, tmp_path, pr=12, checkout=checkout, sha="f" * 40)
    root = write(tmp_path / "verdict", {"ci/registry/repo_suites.py": REGISTRY})
    why = run_ci("why", "--pr", "12", "--history", store_url, "--root", str(root), "--json", "--gate",
                 env={"SLIME_CI_HISTORY_URL": ""})
    assert why.returncode == 1, why.stdout + why.stderr
    got = {v["entry_id"]: (v["kind"], v["suite"], v["blocks"]) for v in json.loads(why.stdout)}
    assert got == {"tests/test_a.py": ("new", "unit", True),
                   "tests/test_b.py": ("already-failing", "unit", False)}, got
    # The run and attempt are the ingest event's (id 900 + the PR), the job the record step's.
    ran = {(v["gh_run_id"], v["gh_run_attempt"], v["gh_job"]) for v in json.loads(why.stdout)}
    assert ran == {("912", 2, "unit_job")}, ran
    checks = run_ci("why", "--pr", "12", "--history", store_url, "--root", str(root), "--checks", "--dry-run",
                    "--json", env={"SLIME_CI_HISTORY_URL": ""})
    assert checks.returncode == 0, checks.stdout + checks.stderr
    [unit] = json.loads(checks.stdout)
    at = {(a["path"], a["line"], a["level"]) for a in unit["annotations"]}
    assert (unit["name"], unit["conclusion"]) == ("slime-ci / unit", "failure"), unit
    assert at == {("tests/test_a.py", ASSERT_LINE, "failure"), ("tests/test_b.py", ASSERT_LINE, "warning")}, at
    # The comment's row of each verdict links the run and names the job that failed it.
    body = run_ci("why", "--pr", "12", "--history", store_url, "--root", str(root), "--comment", "--dry-run",
                  env={"SLIME_CI_HISTORY_URL": "", "GITHUB_REPOSITORY": "o/r", "GITHUB_SERVER_URL": ""})
    assert body.returncode == 0, body.stdout + body.stderr
    link = "[run 912, attempt 2](https://github.com/o/r/actions/runs/912/attempts/2), job `unit_job`"
    rows = [line for line in body.stdout.splitlines() if line.startswith("| `tests/test_")]
    assert len(rows) == 2 and all(link in row for row in rows), body.stdout
    # The verdict job as CI runs it, against the loopback GitHub: the check run is created with
    # those annotations, and the comment links it.
    with fake_github() as (api, gh):
        made = run_ci("why", "--pr", "12", "--history", store_url, "--root", str(root), "--comment", "--checks",
                      "--head", "f" * 40, env={"SLIME_CI_HISTORY_URL": "", **env_for(api)})
        assert made.returncode == 0, made.stdout + made.stderr
        [check] = gh.check_runs
        [comment] = gh.comments[12]
    assert (check["name"], check["conclusion"], check["head_sha"]) == ("slime-ci / unit", "failure", "f" * 40)
    assert {(a["path"], a["start_line"]) for a in check["annotations"]} == {
        ("tests/test_a.py", ASSERT_LINE), ("tests/test_b.py", ASSERT_LINE)}, check["annotations"]
    assert f"[`slime-ci / unit`]({check['html_url']})" in comment["body"], comment["body"]
    # And before any push: `why --last` in that checkout, against main's store read only, gives
    # the same verdicts for its own last run.
    last = run_ci("why", "--last", "--json", "--root", str(laptop), env={"SLIME_CI_HISTORY_URL": store_url})
    assert last.returncode == 0, last.stdout + last.stderr
    assert {v["entry_id"]: v["kind"] for v in json.loads(last.stdout)} == {
        "tests/test_a.py": "new", "tests/test_b.py": "already-failing"}, last.stdout


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
