"""No job that checks out a pull request's code holds an environment or a secret.

Reads the committed workflows (the drift check holds them equal to what the generators
write) the way GitHub would run them: a job checks out PR code when a checkout's `ref`
names the PR's head (`inputs.sha`, `github.event.pull_request…`, `github.head_ref`,
`workflow_run.head…`), or when the workflow starts on `pull_request` and the job checks out
the default ref (the PR's merge commit) without an `if:` that keeps it off pull requests.
Such a job must name no `environment:` (its secrets would reach the PR's code) and no
`secrets.` (GITHUB_TOKEN is not needed by any of them: they read with `github.token`'s
read-only `contents` permission through actions/checkout, which persists no credential).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

NUM_GPUS = 0
WORKFLOWS = REPO / ".github" / "workflows"
PR_REF = re.compile(r"inputs\.sha|github\.event\.pull_request|github\.head_ref|workflow_run\.head"
                    r"|refs/pull/")
PR_EVENTS = frozenset({"pull_request", "pull_request_target"})
# An `if:` conjunct that no pull_request event satisfies.
NOT_ON_PR = re.compile(r"github\.event_name == '(schedule|push|workflow_dispatch)'"
                       r"|github\.event_name != 'pull_request'")


def _top_level(text: str, op: str) -> list[str]:
    """`text` split on `op` outside parentheses and quotes."""
    parts, depth, quoted, start, i = [], 0, False, 0, 0
    while i < len(text):
        c = text[i]
        if c == "'":
            quoted = not quoted
        elif not quoted and c == "(":
            depth += 1
        elif not quoted and c == ")":
            depth -= 1
        elif not quoted and depth == 0 and text.startswith(op, i):
            parts.append(text[start:i])
            start = i + len(op)
            i += len(op)
            continue
        i += 1
    return [*parts, text[start:]]


def _strip(text: str) -> str:
    text = " ".join(text.split())
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1].strip()
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for c in text:
        depth += (c == "(") - (c == ")")
        if depth < 0:
            return False
    return depth == 0


def may_run_on_pull_request(job: dict[str, Any]) -> bool:
    """False only when the job's `if:` is a conjunction with a term no PR event satisfies."""
    condition = job.get("if")
    if not isinstance(condition, str):
        return True
    text = _strip(condition)
    if len(_top_level(text, "||")) > 1:
        return True
    return not any(NOT_ON_PR.fullmatch(_strip(term)) for term in _top_level(text, "&&"))


def pr_code_reason(triggers: set[str], job: dict[str, Any]) -> str | None:
    """Why this job runs a pull request's code, or None."""
    for step in job.get("steps") or ():
        if str(step.get("uses", "")).startswith("actions/checkout@"):
            ref = str((step.get("with") or {}).get("ref", ""))
            if PR_REF.search(ref):
                return f"checks out {ref}"
            if not ref and triggers & PR_EVENTS and may_run_on_pull_request(job):
                return "checks out the pull request's merge commit"
        run = str(step.get("run", ""))
        if PR_REF.search(run) and re.search(r"\bgit (checkout|fetch|switch|worktree)\b|gh pr checkout", run):
            return "checks out a pull request's commit in a script"
    return None


def violations(folder: Path) -> tuple[list[str], set[tuple[str, str]]]:
    """(what is wrong, every (file, job) that runs PR code)."""
    wrong: list[str] = []
    pr_jobs: set[tuple[str, str]] = set()
    for path in sorted(folder.glob("*.yml")):
        wf = yaml.safe_load(path.read_text(encoding="utf-8"))
        on = wf.get("on", wf.get(True))
        triggers = set(on) if isinstance(on, dict) else {on} if isinstance(on, str) else set(on or ())
        for job_id, job in wf["jobs"].items():
            reason = pr_code_reason(triggers, job)
            if reason is None:
                continue
            pr_jobs.add((path.name, job_id))
            if "environment" in job:
                wrong.append(f"{path.name}: {job_id} {reason} and names the environment "
                             f"{json.dumps(job['environment'])}")
            if "secrets" in job:
                wrong.append(f"{path.name}: {job_id} {reason} and passes secrets to a called workflow")
            held = sorted(set(re.findall(r"secrets\.(\w+)", json.dumps(job))) - {"GITHUB_TOKEN"})
            if held:
                wrong.append(f"{path.name}: {job_id} {reason} and reads secrets.{', secrets.'.join(held)}")
    return wrong, pr_jobs


def test_no_job_that_checks_out_pr_code_holds_an_environment_or_a_secret() -> None:
    wrong, pr_jobs = violations(WORKFLOWS)
    assert wrong == []
    # The detector sees the jobs it must see: every pr-test job a PR can start, both jobs of
    # the one-file workflow (they check out inputs.sha), and nothing that runs on main only.
    assert {("run-ci-file.yml", "run_gpu"), ("run-ci-file.yml", "run_cpu"), ("pr-test.yml", "plan"),
            ("pr-test.yml", "megatron"), ("pr-test.yml", "cpu_unit")} <= pr_jobs
    assert not {j for j in pr_jobs if j[1] in ("monitor", "megatron_stability", "mutation", "ingest",
                                               "decide", "resolve", "hud", "pages")}
    # Who names an environment at all: the monitor and the HUD's build (scheduled, main), the
    # Pages deployment (no checkout at all), the ingest job (workflow_run, main), the comment
    # gateway's decide job (issue_comment, main) and the hosted bisect job (dispatched on main,
    # it runs main's commits; its GPU twin holds none).
    holders = set()
    for path in sorted(WORKFLOWS.glob("*.yml")):
        for job_id, job in yaml.safe_load(path.read_text(encoding="utf-8"))["jobs"].items():
            if "environment" in job:
                holders.add((path.name, job_id, job["environment"]["name"]))
    assert holders == {("pr-test.yml", "monitor", "ci-history"), ("pr-test.yml", "hud", "ci-history"),
                       ("pr-test.yml", "pages", "github-pages"),
                       ("history-ingest.yml", "ingest", "ci-history"),
                       ("bisect.yml", "bisect_cpu", "ci-history"),
                       ("ci-comment.yml", "decide", "ci-comment")}


def on_gpu_hosts(folder: Path) -> list[str]:
    """Jobs on self-hosted runners that name an environment or read a secret."""
    wrong = []
    for path in sorted(folder.glob("*.yml")):
        for job_id, job in yaml.safe_load(path.read_text(encoding="utf-8"))["jobs"].items():
            if "self-hosted" in json.dumps(job.get("runs-on", "")) and (
                    "environment" in job or "secrets." in json.dumps(job)):
                wrong.append(f"{path.name}: {job_id}")
    return wrong


def test_no_job_on_a_gpu_host_holds_a_secret_not_even_mains(tmp_path: Path) -> None:
    # A job there leaves its slot's engine and work folder to the slot's next job, and shares
    # the kernel and /dev/shm with every job (docs/security.md), so the scheduled runs of main
    # hold no secret either.
    assert on_gpu_hosts(WORKFLOWS) == []
    old = "      (github.event_name == 'schedule' && (github.event.schedule == '41 3 * * 6'))\n"
    folder = _plant(tmp_path, "pr-test.yml", old, old + "    environment: ci-history\n")
    assert on_gpu_hosts(folder) == ["pr-test.yml: megatron_stability"]
    assert violations(folder)[0] == []  # not PR code: only this rule catches it


def test_the_security_page_says_what_the_docker_socket_gives_a_job() -> None:
    compose = yaml.safe_load((REPO / "runners" / "docker-compose.yml").read_text(encoding="utf-8"))
    mounts = compose["services"]["runner"]["volumes"]
    page = " ".join((REPO / "docs" / "security.md").read_text(encoding="utf-8").split())
    if any(m.split(":")[0].endswith("docker.sock") for m in mounts):
        # The host's socket: the page must say plainly what that gives every job.
        for claim in ("it is root on the GPU host", "`docker inspect` every container",
                      "mount the model and dataset caches read-write", "A socket proxy does not close this"):
            assert claim in page, claim
    else:
        assert "the only engine it reaches is its slot's" in page


def test_every_line_of_what_a_job_can_touch_names_a_test_that_exists() -> None:
    text = (REPO / "docs" / "security.md").read_text(encoding="utf-8")
    section = text.split("## What such a job can touch", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| a job")]
    assert len(rows) >= 9, rows
    files = [REPO / "tests" / "toolkit" / f for f in ("runners/test_rootless_slots.py",
                                                      "github/test_workflow_runners.py",
                                                      "backends/test_docker_argv.py")]
    defined = set(re.findall(r"^def (test_\w+)", "".join(f.read_text(encoding="utf-8") for f in files), re.M))
    for row in rows:
        named = re.findall(r"`(test_\w+)`", row.rsplit("|", 2)[1])
        assert named, f"no test named: {row[:80]}"
        missing = [n for n in named if n not in defined]
        assert not missing, f"{missing} named by docs/security.md do not exist"


def _plant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    folder = tmp_path / "workflows"
    shutil.copytree(WORKFLOWS, folder)
    path = folder / name
    text = path.read_text(encoding="utf-8")
    assert old in text, old
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return folder


GPU_IF = "    if: \"needs.resolve.outputs.tier == 'gpu'\"\n"


def test_a_planted_environment_in_the_job_that_checks_out_inputs_sha_fails(tmp_path: Path) -> None:
    folder = _plant(tmp_path, "run-ci-file.yml", GPU_IF,
                    GPU_IF + "    environment:\n      name: ci-history\n      deployment: false\n")
    wrong, _ = violations(folder)
    assert wrong == ['run-ci-file.yml: run_gpu checks out ${{ inputs.sha }} and names the environment '
                     '{"name": "ci-history", "deployment": false}']


def test_a_planted_secret_in_a_pr_job_fails(tmp_path: Path) -> None:
    # The store's URL back in the session step of a GPU job a labelled PR starts.
    folder = _plant(tmp_path, "pr-test.yml", '          SLIME_CI_LOCK_TIMEOUT: "1800"\n',
                    '          SLIME_CI_LOCK_TIMEOUT: "1800"\n'
                    '          SLIME_CI_HISTORY_URL: "${{ secrets.SLIME_CI_HISTORY_URL }}"\n')
    wrong, _ = violations(folder)
    assert wrong == ["pr-test.yml: sglang_config checks out the pull request's merge commit and reads "
                     "secrets.SLIME_CI_HISTORY_URL"]


def test_the_ingest_job_would_fail_it_if_it_checked_out_the_finished_runs_code(tmp_path: Path) -> None:
    folder = _plant(tmp_path, "history-ingest.yml",
                    'ref: "refs/heads/${{ github.event.repository.default_branch }}"',
                    'ref: "${{ github.event.workflow_run.head_sha }}"')
    wrong, _ = violations(folder)
    assert [w.split(" and ")[0] for w in wrong] == [
        "history-ingest.yml: ingest checks out ${{ github.event.workflow_run.head_sha }}"] * 2


@pytest.mark.parametrize(("condition", "runs_on_pr"), [
    ("(github.event_name == 'schedule' && (github.event.schedule == '23 * * * *'))", False),
    ("github.event_name == 'schedule' || github.event_name == 'pull_request'", True),
    ("(github.event_name == 'schedule') || always()", True),
    ("!cancelled() && github.event_name != 'pull_request'", False),
    ("github.event_name != 'schedule'", True),
    ("always()", True),
])
def test_only_an_if_that_excludes_pull_requests_keeps_a_job_off_them(condition: str, runs_on_pr: bool) -> None:
    assert may_run_on_pull_request({"if": condition}) is runs_on_pr


def test_the_monitor_keeps_its_secret_only_while_no_pull_request_can_start_it(tmp_path: Path) -> None:
    old = "      (github.event_name == 'schedule' && (github.event.schedule == '23 * * * *'))\n"
    folder = _plant(tmp_path, "pr-test.yml", old,
                    old.rstrip("\n") + " || github.event_name == 'pull_request'\n")
    wrong, _ = violations(folder)
    assert [w.split(" checks out")[0] for w in wrong] == ["pr-test.yml: monitor", "pr-test.yml: monitor"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
