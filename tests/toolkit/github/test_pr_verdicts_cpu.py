"""A CPU job's failures get verdicts like a GPU job's: through the real path a PR's run takes.

main and PR #12 each run two jobs, `cpu_unit` (a CPU suite) and `megatron` (a GPU suite, on
emulated GPUs: this machine has none), each in its own checkout as on its own runner. Each
job is real: `python -m ci run`, then its last step `history record --export`; then the
ingest of the run's exports under a `workflow_run` event written here (GitHub's own cannot
exist in a test), on a SQLite file and on the real PostgreSQL server; then `python -m ci
why`. In each suite a failure main does not have is `new`; one main has is `already failing
on main`. The check runs the verdict job would create annotate each failure at its
assertion's line, which the run read from its own JUnit report and the history carried through
the export and the ingest (the verdict job has no report), and each verdict names the Actions
run and attempt that the ingest's event gave.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import PASSING, run_ci, write
from _github_api import env_for, fake_github
from _verdict_store import FAILING

NUM_GPUS = 0
pytestmark = pytest.mark.slow  # four jobs of real CLI runs per store

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="cpu_unit", tier="cpu", purpose="p", profile="e2e", entries=(
            Entry(path="tests/test_a.py"), Entry(path="tests/test_b.py"))),
        Suite(name="megatron", tier="gpu", purpose="p", profile="e2e", label="run-ci-gpu", entries=(
            Entry(path="tests/e2e/test_m.py"), Entry(path="tests/e2e/test_n.py"))),
    )
"""
ASSERT_LINE = 5  # of FAILING and GPU_FAILING
GPU_FAILING = FAILING.replace("NUM_GPUS = 0", "NUM_GPUS = 2")
GPU_PASSING = PASSING.replace("NUM_GPUS = 0", "NUM_GPUS = 2")
# Each job's files: main's, then the PR's. One new failure and one already on main per suite.
MAIN = {"cpu_unit": {"tests/test_a.py": PASSING, "tests/test_b.py": FAILING},
        "megatron": {"tests/e2e/test_m.py": GPU_PASSING, "tests/e2e/test_n.py": GPU_FAILING}}
PR = {"cpu_unit": {"tests/test_a.py": FAILING, "tests/test_b.py": FAILING},
      "megatron": {"tests/e2e/test_m.py": GPU_FAILING, "tests/e2e/test_n.py": GPU_FAILING}}
WANTED = {"tests/test_a.py": ("new", "cpu_unit", True), "tests/test_b.py": ("already-failing", "cpu_unit", False),
          "tests/e2e/test_m.py": ("new", "megatron", True),
          "tests/e2e/test_n.py": ("already-failing", "megatron", False)}


def _job(tmp: Path, name: str, suite: str, files: dict[str, str], env: dict[str, str]) -> Path:
    """One job of `suite`, in its own checkout: the session (a GPU suite on emulated GPUs), then
    its record step exporting its runs; the export folder."""
    root = write(tmp / name, {"ci/registry/repo_suites.py": REGISTRY, **files})
    clean = {k: "" for k in os.environ if k.startswith("GITHUB_")}
    job_env = {**clean, "SLIME_CI_HISTORY_URL": "", "GITHUB_JOB": f"{suite}_job", "GITHUB_RUN_ID": "77", **env}
    gpus = ("--emulate-gpus", "--gpus", "2") if suite == "megatron" else ()
    ran = run_ci("run", "--suite", suite, "--root", str(root), "--no-prefork", "--no-docker", *gpus, env=job_env)
    assert ran.returncode in (0, 1), ran.stdout + ran.stderr
    step = run_ci("history", "record", "--root", str(root), "--suite", suite, "--status",
                  "success" if ran.returncode == 0 else "failure", "--export", ".ci-cache/history-export",
                  env=job_env)
    assert step.returncode == 0 and "exported 1 run(s)" in step.stdout, step.stdout + step.stderr
    return root / ".ci-cache/history-export"


def _artifacts(tmp: Path, name: str, exports: list[Path]) -> Path:
    """What the ingest job downloads for one workflow run: every job's export, one folder each."""
    folder = tmp / name
    for export in exports:
        shutil.copytree(export, folder / export.parents[1].name)
    return folder


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


def test_each_suites_new_failure_is_new_and_one_main_has_is_already_failing(store_url, tmp_path):
    main = {"GITHUB_REF_NAME": "main", "GITHUB_EVENT_NAME": "push"}
    # main's last run: in each suite one file passes, one fails. Its commit is on main (the ingest checks).
    checkout, sha = _checkout(tmp_path)
    exports = [_job(tmp_path, f"main-{suite}", suite, files, {**main, "GITHUB_SHA": sha})
               for suite, files in MAIN.items()]
    _ingest(_artifacts(tmp_path, "main-artifacts", exports), store_url, tmp_path, pr=None, checkout=checkout,
            sha=sha)
    pr = {"GITHUB_HEAD_REF": "feature", "GITHUB_EVENT_NAME": "pull_request", "GITHUB_SHA": "f" * 40}
    exports = [_job(tmp_path, f"pr-{suite}", suite, files, pr) for suite, files in PR.items()]
    laptop = tmp_path / "pr-cpu_unit"  # the PR's cpu_unit checkout: its own store holds the run, as a laptop's would
    _ingest(_artifacts(tmp_path, "pr-artifacts", exports), store_url, tmp_path, pr=12, checkout=checkout,
            sha="f" * 40)
    root = write(tmp_path / "verdict", {"ci/registry/repo_suites.py": REGISTRY})
    why = run_ci("why", "--pr", "12", "--history", store_url, "--root", str(root), "--json", "--gate",
                 env={"SLIME_CI_HISTORY_URL": ""})
    assert why.returncode == 1, why.stdout + why.stderr
    got = {v["entry_id"]: (v["kind"], v["suite"], v["blocks"]) for v in json.loads(why.stdout)}
    assert got == WANTED, got
    # The run and attempt are the ingest event's (id 900 + the PR), the job the record step's.
    ran = {v["suite"]: (v["gh_run_id"], v["gh_run_attempt"], v["gh_job"]) for v in json.loads(why.stdout)}
    assert ran == {"cpu_unit": ("912", 2, "cpu_unit_job"), "megatron": ("912", 2, "megatron_job")}, ran
    checks = run_ci("why", "--pr", "12", "--history", store_url, "--root", str(root), "--checks", "--dry-run",
                    "--json", env={"SLIME_CI_HISTORY_URL": ""})
    assert checks.returncode == 0, checks.stdout + checks.stderr
    planned = {c["name"]: c for c in json.loads(checks.stdout)}
    assert {n: c["conclusion"] for n, c in planned.items()} == {"slime-ci / cpu_unit": "failure",
                                                              "slime-ci / megatron": "failure"}, planned
    at = {(a["path"], a["line"], a["level"]) for c in planned.values() for a in c["annotations"]}
    assert at == {("tests/test_a.py", ASSERT_LINE, "failure"), ("tests/test_b.py", ASSERT_LINE, "warning"),
                  ("tests/e2e/test_m.py", ASSERT_LINE, "failure"),
                  ("tests/e2e/test_n.py", ASSERT_LINE, "warning")}, at
    # The comment's row of each verdict links the run and names the job that failed it.
    body = run_ci("why", "--pr", "12", "--history", store_url, "--root", str(root), "--comment", "--dry-run",
                  env={"SLIME_CI_HISTORY_URL": "", "GITHUB_REPOSITORY": "o/r", "GITHUB_SERVER_URL": ""})
    assert body.returncode == 0, body.stdout + body.stderr
    link = "[run 912, attempt 2](https://github.com/o/r/actions/runs/912/attempts/2), job `{}_job`"
    rows = [line for line in body.stdout.splitlines() if line.startswith("| `tests/")]
    assert len(rows) == 4 and all(link.format(WANTED[row.split("`")[1]][1]) in row for row in rows), body.stdout
    # The verdict job as CI runs it, against the loopback GitHub: one check run per suite with
    # those annotations, each new failure's at its assertion, and the comment links both.
    with fake_github() as (api, gh):
        made = run_ci("why", "--pr", "12", "--history", store_url, "--root", str(root), "--comment", "--checks",
                      "--head", "f" * 40, env={"SLIME_CI_HISTORY_URL": "", **env_for(api)})
        assert made.returncode == 0, made.stdout + made.stderr
        made_runs = {c["name"]: c for c in gh.check_runs}
        [comment] = gh.comments[12]
    assert sorted(made_runs) == ["slime-ci / cpu_unit", "slime-ci / megatron"], made_runs
    for suite, (new, old) in {"cpu_unit": ("tests/test_a.py", "tests/test_b.py"),
                              "megatron": ("tests/e2e/test_m.py", "tests/e2e/test_n.py")}.items():
        check = made_runs[f"slime-ci / {suite}"]
        assert (check["conclusion"], check["head_sha"]) == ("failure", "f" * 40), check
        levels = {(a["path"], a["start_line"]): a["annotation_level"] for a in check["annotations"]}
        assert levels == {(new, ASSERT_LINE): "failure", (old, ASSERT_LINE): "warning"}, check["annotations"]
        assert f"[`slime-ci / {suite}`]({check['html_url']})" in comment["body"], comment["body"]
    # And before any push: `why --last` in the cpu_unit checkout, against main's store read
    # only, gives the same verdicts for its own last run.
    last = run_ci("why", "--last", "--json", "--root", str(laptop), env={"SLIME_CI_HISTORY_URL": store_url})
    assert last.returncode == 0, last.stdout + last.stderr
    assert {v["entry_id"]: (v["kind"], v["suite"], v["blocks"]) for v in json.loads(last.stdout)} == {
        k: v for k, v in WANTED.items() if v[1] == "cpu_unit"}, last.stdout


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
