"""The table of events: for each, which jobs `python -m ci plan` runs and why (one test a row).

Runs the real CLI on this repository's registry and policy, then checks the generated
gateway and one-file workflows keep the promises the plan relies on.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO
from _gitrepo import git

from ci.errors import UsageError
from ci.github.gateway_workflow import GATEWAY_PATH, RUN_FILE_PATH
from ci.github.job_plan import PLAN_JOB, gated_by_plan, main, plan_term, table
from ci.github.workflow import WORKFLOW_PATH, render
from ci.registry import Suite
from ci.registry.cadences import DEFAULT_SCHEDULES, check_schedules, gpu_irrelevant
from ci.registry.job_timeouts import MAX_MINUTES, suite_minutes
from ci.registry.repo_suites import SUITES
from ci.registry.workflow_style import Style

NUM_GPUS = 0

CPU = {"cpu_unit", "agent_adapter", "toolkit", "lint", "gpu_smoke"}
GPU = {"sglang_config", "megatron", "precision", "ckpt", "image", "changed"}
NIGHTLY, WEEKLY, MONITOR = list(DEFAULT_SCHEDULES)
SHA = "89abcdef0123456789abcdef0123456789abcdef"


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main([*args, "--root", str(REPO), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _runs(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, str]:
    """job -> why, for the jobs that run."""
    return {d["job"]: d["why"] for d in _plan(capsys, *args) if d["runs"]}


def _why(capsys: pytest.CaptureFixture[str], job: str, *args: str) -> str:
    return str(next(d["why"] for d in _plan(capsys, *args) if d["job"] == job))


ROWS: list[tuple[str, list[str], set[str]]] = [
    ("push", ["--event", "push"], CPU),
    ("pull request", ["--event", "pull_request"], CPU),
    ("pull request + label", ["--labels", "run-ci-megatron"], CPU | {"megatron"}),
    ("second label added", ["--labels", "run-ci-megatron", "--added", "run-ci-ckpt"], {"ckpt"}),
    ("docs-only PR + label", ["--labels", "run-ci-megatron", "--paths", "docs/guide.md,README.md,a.png"],
     CPU),
    ("tests-only PR + run-ci-changed",
     ["--labels", "run-ci-changed", "--paths", "tests/test_gae.py"], CPU | {"changed"}),
    ("nightly cron", ["--event", "schedule", "--cron", NIGHTLY], {"sglang_config", "megatron",
                                                                   "precision", "ckpt",
                                                                   "plants", "mutation", "gpu_smoke_nightly",
                                                                   "actions_real"}),
    ("weekly cron", ["--event", "schedule", "--cron", WEEKLY],
     {"sglang_config", "megatron", "precision", "ckpt", "image", "megatron_stability", "lock_check"}),
    ("monitor cron", ["--event", "schedule", "--cron", MONITOR], {"monitor"}),
    ("dispatch", ["--event", "workflow_dispatch"], CPU | GPU),
]


@pytest.mark.parametrize(("name", "args", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_event_row(capsys: pytest.CaptureFixture[str], name: str, args: list[str],
                   expected: set[str]) -> None:
    assert set(_runs(capsys, *args)) == expected, name


def test_reasons_the_rows_give(capsys: pytest.CaptureFixture[str]) -> None:
    assert _why(capsys, "megatron", "--labels", "run-ci-megatron", "--added", "run-ci-ckpt") == \
        "adding run-ci-ckpt leaves this job alone (it runs on label run-ci-megatron)"
    assert _why(capsys, "megatron", "--labels", "run-ci-megatron", "--paths", "docs/a.md").startswith(
        "the diff touches only GPU-irrelevant paths (1 file(s)")
    # One path that may reach a GPU runs the GPU job as before.
    assert _why(capsys, "megatron", "--labels", "run-ci-megatron",
                "--paths", "docs/a.md,slime/ray/actor.py") == "the PR has label run-ci-megatron"
    assert _why(capsys, "changed", "--labels", "run-ci-changed", "--paths",
                "tests/test_gae.py,tests/e2e/test_tiny_ckpt.py").endswith(
        "changes only tests: runs only tests/test_gae.py, tests/e2e/test_tiny_ckpt.py")
    assert _why(capsys, "image", "--event", "schedule", "--cron", NIGHTLY) == \
        "the nightly schedule does not run it"
    assert _why(capsys, "megatron_stability", "--event", "workflow_dispatch").startswith(
        "only its schedule runs it")


# --- the workflow's plan job, run for real ---------------------------------------------------
# Its script (from the generated workflow) runs in a git repository whose HEAD is a merge commit,
# as actions/checkout leaves a pull_request: the base tip as its first parent, the PR's branch
# as its second. Its published `jobs` output is what the GPU jobs' `if:` asks.

DOCS = {"docs/guide.md": "how to\n", "README.md": "read me\n"}
CODE = {"slime/ray/actor.py": "X = 2\n", "README.md": "read me\n"}


def _merge_checkout(base: Path, change: dict[str, str], rename: tuple[str, str] | None = None) -> Path:
    root = base / "checkout"
    root.mkdir()
    git(root, "init", "--quiet", "-b", "main")
    for rel, text in {"slime/ray/actor.py": "X = 1\n", "slime/a.py": "A = 1\n", "README.md": "x\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    git(root, "add", "-A")
    git(root, "commit", "--quiet", "-m", "base")
    git(root, "checkout", "--quiet", "-b", "feature")
    for rel, text in change.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    if rename:
        (root / rename[1]).parent.mkdir(parents=True, exist_ok=True)
        git(root, "mv", *rename)
    git(root, "add", "-A")
    git(root, "commit", "--quiet", "-m", "the PR")
    git(root, "checkout", "--quiet", "main")
    git(root, "merge", "--quiet", "--no-ff", "feature", "-m", "merge")
    return root


def _plan_step(tmp_path: Path, change: dict[str, str], *, labels: str, action: str = "synchronize",
               added: str = "", fork: bool = False,
               rename: tuple[str, str] | None = None) -> tuple[set[str], str]:
    """(published job ids, step summary) of the plan job's script on one PR event."""
    wf = yaml.safe_load(render(table())[WORKFLOW_PATH])
    step = next(s for s in wf["jobs"][PLAN_JOB]["steps"] if s.get("id") == "plan")
    root = _merge_checkout(tmp_path, change, rename)
    out, summary = tmp_path / "output", tmp_path / "summary"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RUNNER_TEMP": str(tmp_path),
           "GITHUB_ACTIONS": "true", "GITHUB_OUTPUT": str(out), "GITHUB_STEP_SUMMARY": str(summary),
           "LABELS": labels, "ACTION": action, "ADDED": added, "FORK": "true" if fork else "false"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python`
    done = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [x for x in out.read_text(encoding="utf-8").splitlines() if x.startswith("jobs=")]
    return set(json.loads(line.removeprefix("jobs="))), summary.read_text(encoding="utf-8")


CPU_PR = CPU  # the CPU jobs every new commit of a PR runs
PLAN_ROWS: list[tuple[str, dict[str, Any], set[str]]] = [
    ("docs-only PR + label", {"change": DOCS, "labels": "run-ci-megatron"}, CPU_PR),
    ("code PR + label", {"change": CODE, "labels": "run-ci-megatron"}, CPU_PR | {"megatron"}),
    ("second label added", {"change": CODE, "labels": "run-ci-megatron,run-ci-ckpt",
                            "action": "labeled", "added": "run-ci-ckpt"}, {"ckpt"}),
    ("label added to a docs-only PR", {"change": DOCS, "labels": "run-ci-ckpt", "action": "labeled",
                                       "added": "run-ci-ckpt"}, set()),
    ("unrelated label added", {"change": CODE, "labels": "run-ci-megatron,documentation",
                               "action": "labeled", "added": "documentation"}, set()),
    ("fork PR + label", {"change": CODE, "labels": "run-ci-megatron", "fork": True}, CPU_PR),
    ("code moved into docs/", {"change": {}, "rename": ("slime/a.py", "docs/a.py"),
                               "labels": "run-ci-megatron"}, CPU_PR | {"megatron"}),
]


@pytest.mark.parametrize(("name", "kwargs", "expected"), PLAN_ROWS, ids=[r[0] for r in PLAN_ROWS])
def test_plan_job_row(tmp_path: Path, name: str, kwargs: dict[str, Any], expected: set[str]) -> None:
    published, summary = _plan_step(tmp_path, **kwargs)
    assert published == expected, name
    assert "| job | runs | why |" in summary


def test_a_gpu_job_the_diff_skips_shows_why_and_every_gpu_job_asks_the_plan(tmp_path: Path) -> None:
    published, summary = _plan_step(tmp_path, DOCS, labels="run-ci-megatron")
    assert "megatron" not in published
    row = next(x for x in summary.splitlines() if x.startswith("| `megatron` |"))
    assert "**skipped**" in row and "GPU-irrelevant paths (2 file(s)" in row
    wf = yaml.safe_load(render(table())[WORKFLOW_PATH])
    gated = [j for j in table() if gated_by_plan(j)]
    assert {j.id for j in gated} == GPU - {"megatron_stability"}
    for job in gated:
        spec = wf["jobs"][job.id]
        assert spec["needs"] == PLAN_JOB and plan_term(job) in spec["if"]
        # The verdict also decides the concurrency slot: a skipped job cancels nothing.
        assert plan_term(job) in spec["concurrency"]["group"]
        assert spec["if"].startswith("!cancelled()")  # a push, schedule or dispatch skips plan
    for job in table():
        if gated_by_plan(job):
            continue
        if job.planned_shards and not job.scheduled_only:
            # It waits for the plan's shard count, never for its verdict: it runs on every PR.
            spec = wf["jobs"][job.id]
            assert spec["needs"] == PLAN_JOB and "needs.plan.outputs.jobs" not in spec["if"], job.id
            assert spec["if"].startswith("!cancelled()")
        else:
            assert "needs" not in wf["jobs"][job.id], job.id
    plan = wf["jobs"][PLAN_JOB]
    assert plan["if"] == "github.event_name == 'pull_request'"
    assert plan["steps"][0]["with"]["fetch-depth"] == 2
    assert "run${{ github.run_id }}" in plan["concurrency"]["group"]  # it never cancels a run
    assert plan["permissions"] == {"contents": "read"}


def test_plan_paths_from_a_file_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = tmp_path / "paths"
    paths.write_bytes(b"docs/a.md\0README.md\0")
    assert "megatron" not in _runs(capsys, "--labels", "run-ci-megatron", "--paths-from", str(paths))
    paths.write_text("docs/a.md\nslime/x.py\n", encoding="utf-8")
    assert "megatron" in _runs(capsys, "--labels", "run-ci-megatron", "--paths-from", str(paths))
    with pytest.raises(UsageError, match="cannot read it"):
        main(["--paths-from", str(tmp_path / "none"), "--root", str(REPO)])
    with pytest.raises(UsageError, match="not --paths and --paths-from"):
        main(["--paths", "a", "--paths-from", str(paths), "--root", str(REPO)])


def test_sessions_that_are_not_suites_get_their_jobs_from_the_registry() -> None:
    from ci.github.job_plan import session_job
    from ci.registry import Check, Smoke, SmokeRun
    from ci.registry.repo_suites import SESSIONS

    jobs = {j.id: j for j in table()}
    for session in SESSIONS:
        if isinstance(session, Check) and session.cadences:
            job = jobs[session.name]  # scheduled only: its cadence's cron, hosted, its own bound
            assert job.scheduled_only and job.minutes == session.minutes and not job.self_hosted
            assert job.crons == tuple(c for c, n in DEFAULT_SCHEDULES.items() if n in session.cadences)
    assert "history" not in jobs  # on demand only: no event or cadence names it
    assert jobs["lint"].label is None and not jobs["lint"].scheduled_only
    smoke = Smoke(name="s", purpose="p", profiles=(), runs=(SmokeRun(suite="nope"),))
    with pytest.raises(UsageError, match="runs suite 'nope', which the registry lacks"):
        session_job(smoke, Style(), SUITES)
    both = Check(name="c", purpose="p", profiles=(), commands=(), every_event=True, cadences=("nightly",))
    with pytest.raises(UsageError, match="not both"):
        session_job(both, Style(), SUITES)
    with pytest.raises(UsageError, match=r"maps to no cadence|no cron maps to it"):
        table(SUITES, Style(), (Check(name="c", purpose="p", profiles=(), commands=(), cadences=("monthly",)),))


COMMENT_ROWS: list[tuple[str, str, str, bool, str]] = [
    # comment, actor, association, fork, verdict
    ("/rerun-test tests/e2e/test_tiny_ckpt.py", "alice", "MEMBER", False, "allowed"),
    ("/rerun-test tests/e2e/test_tiny_ckpt.py", "eve", "NONE", False, "refused"),
    ("/rerun-test tests/e2e/test_tiny_ckpt.py", "alice", "MEMBER", True, "refused"),
    ("/rerun-failed", "alice", "COLLABORATOR", False, "allowed"),
    ("/rerun-failed", "eve", "CONTRIBUTOR", False, "refused"),
    ("/rerun-failed", "alice", "MEMBER", True, "refused"),
    ("/run-ci run-ci-precision", "owner", "OWNER", False, "allowed"),
    ("/run-ci run-ci-precision", "carol", "COLLABORATOR", False, "refused"),
    ("/run-ci run-ci-precision", "owner", "OWNER", True, "refused"),
    ("/help", "eve", "NONE", False, "allowed"),
    ("/help", "eve", "NONE", True, "allowed"),
]


@pytest.mark.parametrize(("comment", "actor", "association", "fork", "verdict"), COMMENT_ROWS)
def test_comment_row(capsys: pytest.CaptureFixture[str], comment: str, actor: str, association: str,
                     fork: bool, verdict: str) -> None:
    out = _plan(capsys, "--event", "issue_comment", "--comment", comment, "--actor", actor,
                "--association", association, "--fork" if fork else "--no-fork",
                "--pr", "9", "--sha", SHA)
    assert out["verdict"] == verdict, out["why"]
    runs_code = out["dispatch"] is not None or out["rerun_failed"] or out["add_label"] is not None
    assert runs_code == (verdict == "allowed" and comment != "/help")
    if verdict == "refused":
        assert "\n" not in out["why"] and out["reply"] == f"Not run: {out['why']}."


def test_run_ci_by_an_allowed_user_adds_the_label_and_dispatches_the_suite_now(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan(capsys, "--event", "issue_comment", "--comment", "/run-ci run-ci-precision",
                "--actor", "owner", "--association", "OWNER", "--pr", "9", "--sha", SHA)
    assert out["add_label"] == "run-ci-precision" and out["dispatch"]["inputs"]["suite"] == "precision"
    assert out["actions"] == [
        {"job": "label", "does": "add label run-ci-precision (pull-requests: write)"},
        {"job": "run", "does": f"dispatch run-ci-file.yml: nox -s precision on {SHA} (actions: write)"},
        {"job": "answer", "does": "react rocket and reply (issues: write)"}]
    assert "starts no workflow run" in out["why_dispatch"]
    assert main(["--event", "issue_comment", "--comment", "/run-ci run-ci-precision", "--actor", "owner",
                 "--association", "OWNER", "--pr", "9", "--sha", SHA, "--root", str(REPO)]) == 0
    text = capsys.readouterr().out
    assert f"runs: nox -s precision on {SHA}" in text and "adds label: run-ci-precision (a label" in text
    assert "job label: add label run-ci-precision" in text


def test_dispatch_of_the_one_file_workflow_resolves_or_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan(capsys, "--event", "workflow_dispatch", "--suite", "ckpt",
                "--only", "tests/e2e/test_tiny_ckpt.py", "--sha", SHA)
    assert out["tier"] == "gpu" and out["num_gpus"] == 2
    assert out["command_line"] == "nox -s ckpt -- --only tests/e2e/test_tiny_ckpt.py"
    with pytest.raises(UsageError, match="not a registered test file of ckpt"):
        main(["--event", "workflow_dispatch", "--suite", "ckpt", "--only", "tests/test_gae.py",
              "--root", str(REPO)])
    with pytest.raises(UsageError, match="unknown suite 'nope'"):
        main(["--event", "workflow_dispatch", "--suite", "nope", "--root", str(REPO)])


def test_an_unmapped_cron_is_an_error_not_a_silent_nightly() -> None:
    with pytest.raises(UsageError, match="cron '0 0 \\* \\* \\*' maps to no cadence"):
        main(["--event", "schedule", "--cron", "0 0 * * *", "--root", str(REPO)])
    with pytest.raises(UsageError, match="maps to cadence 'monthly', which no suite runs on"):
        check_schedules({"1 1 1 * *": "monthly"}, SUITES)
    mutation = Suite(name="mutation", tier="cpu", purpose="p", profile="dev", cadences=("nightly",))
    check_schedules({NIGHTLY: "nightly"}, (mutation,))  # a CPU suite tagged nightly, as data
    with pytest.raises(UsageError, match="suite mutation runs on cadence 'nightly' but no cron"):
        check_schedules({WEEKLY: "weekly"}, (mutation, *SUITES))
    with pytest.raises(UsageError, match="expected five cron fields"):
        check_schedules({"nightly": "nightly"}, (mutation,))


def test_gpu_irrelevant_paths() -> None:
    patterns = Style().gpu_irrelevant
    assert gpu_irrelevant("docs/x/y.py", patterns) and gpu_irrelevant("slime/README.md", patterns)
    assert not gpu_irrelevant("docsearch.py", patterns) and not gpu_irrelevant("slime/x.py", patterns)


def test_every_job_has_a_timeout_derived_from_its_entries() -> None:
    wf = yaml.safe_load(render(table())[WORKFLOW_PATH])
    for job in table():
        assert wf["jobs"][job.id]["timeout-minutes"] == job.minutes <= MAX_MINUTES
    by = {s.name: s for s in SUITES}
    # megatron: 20 setup + 30 lock wait + its entries' timeouts in turn.
    work = sum(e.timeout or by["megatron"].timeout for e in by["megatron"].entries)
    assert suite_minutes(by["megatron"]) == 20 + 30 + math.ceil(work / 60)
    assert suite_minutes(by["changed"]) == MAX_MINUTES  # its entries come from the diff
    step = next(s for s in wf["jobs"]["megatron"]["steps"] if s.get("name") == "nox -s megatron")
    assert int(step["env"]["SLIME_CI_LOCK_TIMEOUT"]) < 60 * by_minutes(wf, "megatron")


def test_the_ci_lock_wait_comes_from_the_job_and_a_bad_value_is_one_line() -> None:
    from ci.run.command import _lock_timeout_from

    assert _lock_timeout_from({"SLIME_CI_LOCK_TIMEOUT": "1800"}) == 1800.0
    assert _lock_timeout_from({}) > 1800  # the local default is the long one
    with pytest.raises(UsageError, match="SLIME_CI_LOCK_TIMEOUT='soon': expected seconds"):
        _lock_timeout_from({"SLIME_CI_LOCK_TIMEOUT": "soon"})


def by_minutes(wf: dict[str, Any], job: str) -> int:
    return int(wf["jobs"][job]["timeout-minutes"])


def test_scheduled_runs_never_share_a_concurrency_group_with_prs() -> None:
    wf = yaml.safe_load(render(table())[WORKFLOW_PATH])
    assert "pull_request" not in wf["jobs"]["megatron_stability"]["concurrency"]["group"]
    assert "run${{ github.run_id }}" in wf["jobs"]["megatron_stability"]["concurrency"]["group"]


def test_the_gateway_never_checks_out_pr_code_and_scopes_its_permissions() -> None:
    files = render(table())
    gw = yaml.safe_load(files[GATEWAY_PATH])
    assert gw["permissions"] == {} and set(gw["on"]) == {"issue_comment"}
    assert list(gw["jobs"]) == ["decide", "label", "run", "answer"]
    job = gw["jobs"]["decide"]  # the only job that checks out, and it may write nothing
    assert job["permissions"] == {"contents": "read", "pull-requests": "read"}
    for other in ("label", "run", "answer"):
        assert "actions/checkout" not in json.dumps(gw["jobs"][other])
        assert len(gw["jobs"][other]["permissions"]) == 1
        assert all(v == "write" for v in gw["jobs"][other]["permissions"].values())
    assert gw["jobs"]["label"]["permissions"] == {"pull-requests": "write"}  # only it can add the label
    checkouts = [s for s in job["steps"] if "actions/checkout" in s.get("uses", "")]
    assert [c["with"]["ref"] for c in checkouts] == ["${{ github.event.repository.default_branch }}"]
    # The team token only in the step that looks up membership, from the ci-comment environment.
    assert job["environment"] == {"name": "ci-comment", "deployment": False}
    holders = [s for j in gw["jobs"].values() for s in j["steps"] if "secrets." in json.dumps(s)]
    assert holders == [job["steps"][-1]]
    assert holders[0]["env"]["SLIME_CI_TEAMS_TOKEN"] == "${{ secrets.SLIME_CI_TEAMS_TOKEN }}"
    # The comment body reaches the shell only through the environment, never through ${{ }}.
    assert all("${{" not in s.get("run", "") for j in gw["jobs"].values() for s in j["steps"])
    one = yaml.safe_load(files[RUN_FILE_PATH])
    assert one["jobs"]["resolve"]["permissions"] == {"contents": "read", "pull-requests": "read"}
    for tier in ("cpu", "gpu"):
        run = one["jobs"][f"run_{tier}"]
        assert run["needs"] == "resolve" and run["if"] == f"needs.resolve.outputs.tier == '{tier}'"
        assert run["steps"][0]["with"]["ref"] == "${{ inputs.sha }}"
        session = next(s for s in run["steps"] if s["name"] == "nox -s <suite> -- --only <file>")
        assert 'nox -s "$SUITE" -- --only "$ONLY"' in session["run"]
        # It runs the PR's commit: no environment, no secret. The GPU run records itself in its
        # own store and uploads its runs for the ingest workflow, as pr-test's GPU jobs do.
        gpu = tier == "gpu"
        assert "environment" not in run and "secrets." not in json.dumps(run)
        if gpu:
            record, upload = run["steps"][-2:]
            assert record["if"] == upload["if"] == "always()"
            assert record["run"] == ('nox -s history -- record --suite "$SUITE" --status "$STATUS"'
                                     " --export .ci-cache/history-export")
            assert upload["with"]["name"] == "history-run-ci-file-gpu"
        else:
            assert run["steps"][-1] is session
    # The ingest workflow reads the PR's number back from the run's name.
    assert one["run-name"] == "pr-test run ${{ inputs.suite }} ${{ inputs.only }} for PR #${{ inputs.pr }}"


def test_a_registry_can_turn_comment_commands_off() -> None:
    files = render(table(), Style(comment_commands=False))
    assert GATEWAY_PATH not in files and RUN_FILE_PATH not in files


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
