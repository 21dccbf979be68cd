"""The comment gateway's generated jobs, run as bash scripts: decide, label, run, answer.

Two stand-ins, because this machine has neither GitHub nor its CLI: a loopback HTTP server
plays GitHub's REST API (the team-membership calls the decide step makes through the
toolkit, with the optional SLIME_CI_TEAMS_TOKEN), and a `gh` script on PATH plays the
GitHub CLI, answering `gh api repos/…/pulls/N` and recording every other call. The
toolkit, the scripts and the policy are the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, loopback_server, write

from ci.github.gateway_workflow import GATEWAY_PATH
from ci.github.job_plan import table
from ci.github.workflow import render

NUM_GPUS = 0

TOKEN = "ghp_" + "T3am5" * 7  # a fake org-read token
SHA = "0123456789abcdef0123456789abcdef01234567"
REGISTRY = """
    from ci.registry import Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
              exclude=("tests/e2e",)),
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", label="run-ci-train",
              include=("tests/e2e",)),
    )
"""
POLICY = {"commands": {
    "run-ci": {"associations": ["OWNER"], "users": ["carol"], "teams": ["gpu-ci"]},
    "rerun-failed": {"associations": ["MEMBER"]},
    "help": {"anyone": True},
}}
# team -> active members, as the stand-in API knows them
TEAMS = {"gpu-ci": {"dave"}}


@pytest.fixture
def github() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A loopback stand-in for GitHub's REST API: GET /orgs/O/teams/T/memberships/U."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({"path": self.path, "auth": self.headers.get("Authorization")})
            parts = self.path.strip("/").split("/")
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                code, body = 403, {"message": "Resource not accessible by integration"}
            elif len(parts) == 6 and parts[0] == "orgs" and parts[4] == "memberships":
                member = parts[5] in TEAMS.get(parts[3], set())
                code, body = (200, {"state": "active", "role": "member"}) if member else (404, {})
            else:
                code, body = 404, {}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    with loopback_server(Handler) as url:
        yield url, seen


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY, "tests/test_a.py": "NUM_GPUS = 0\n",
                                     "tests/e2e/test_b.py": "NUM_GPUS = 1\n"})
    (root / ".github").mkdir()
    (root / ".github/ci-access.json").write_text(json.dumps(POLICY), encoding="utf-8")
    return root


def _gh(tmp_path: Path, fork: bool = False) -> tuple[Path, Path]:
    """The `gh` stand-in: the PR's JSON for `gh api repos/R/pulls/N`, a record of every call."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    calls = tmp_path / "gh-calls.jsonl"
    head = "someone/slime" if fork else "acme/slime"
    pr = json.dumps({"head": {"sha": SHA, "repo": {"full_name": head}}})
    (bindir / "gh").write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"if sys.argv[1:3] == ['api', 'repos/acme/slime/pulls/7']:\n    print({pr!r})\n"
        "elif sys.argv[1:3] == ['run', 'list']:\n    print('4242')\n")
    (bindir / "gh").chmod(0o755)
    return bindir, calls


def _jobs() -> dict[str, Any]:
    jobs: dict[str, Any] = yaml.safe_load(render(table())[GATEWAY_PATH])["jobs"]
    return jobs


def _bash(script: str, env: dict[str, str], cwd: Path, tmp_path: Path, bindir: Path) -> str:
    full = {"PATH": f"{bindir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin",
            "HOME": str(tmp_path), "PYTHONPATH": str(REPO), "RUNNER_TEMP": str(tmp_path),
            "GITHUB_OUTPUT": str(tmp_path / "output"), **env}
    done = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _decide(repo: Path, tmp_path: Path, body: str, actor: str, association: str, api: str,
            token: str = "", fork: bool = False) -> dict[str, Any]:
    """Run the decide job's step as Actions would; the decision it publishes."""
    (step,) = [s for s in _jobs()["decide"]["steps"] if s.get("id") == "decide"]
    bindir, _ = _gh(tmp_path, fork)
    env = {"GH_TOKEN": "workflow-token", "REPO": "acme/slime", "PR": "7", "BODY": body, "ACTOR": actor,
           "ASSOCIATION": association, "ORG": "acme", "SLIME_CI_TEAMS_TOKEN": token,
           "GITHUB_API_URL": api}
    assert set(step["env"]) == set(env) - {"GITHUB_API_URL"}  # Actions sets GITHUB_API_URL itself
    (tmp_path / "output").unlink(missing_ok=True)
    _bash(step["run"], env, repo, tmp_path, bindir)
    (line,) = (tmp_path / "output").read_text(encoding="utf-8").splitlines()
    key, _, value = line.partition("=")
    assert key == "decision"
    decision: dict[str, Any] = json.loads(value)
    return decision


def test_a_team_member_is_admitted_with_the_org_token_and_refused_in_one_line_without(
        repo: Path, tmp_path: Path, github: tuple[str, list[dict[str, Any]]]) -> None:
    api, seen = github
    allowed = _decide(repo, tmp_path, "/run-ci run-ci-train", "dave", "CONTRIBUTOR", api, TOKEN)
    assert allowed["verdict"] == "allowed" and allowed["why"] == "team gpu-ci may"
    assert seen == [{"path": "/orgs/acme/teams/gpu-ci/memberships/dave", "auth": f"Bearer {TOKEN}"}]
    seen.clear()
    refused = _decide(repo, tmp_path, "/run-ci run-ci-train", "dave", "CONTRIBUTOR", api)
    assert refused["verdict"] == "refused" and refused["add_label"] is None and refused["dispatch"] is None
    assert refused["why"] == ("dave (CONTRIBUTOR) may use /run-ci only through team gpu-ci, which the "
                              "gateway cannot check: set the SLIME_CI_TEAMS_TOKEN secret (a token with "
                              "org members:read) so the gateway can read team membership")
    assert seen == []  # no token: GitHub is not asked
    bad = _decide(repo, tmp_path, "/run-ci run-ci-train", "dave", "CONTRIBUTOR", api, "ghp_wrong")
    assert bad["verdict"] == "refused" and "refused SLIME_CI_TEAMS_TOKEN (HTTP 403): it needs org " \
        "members:read" in bad["why"]
    outsider = _decide(repo, tmp_path, "/run-ci run-ci-train", "eve", "CONTRIBUTOR", api, TOKEN)
    assert outsider["verdict"] == "refused" and outsider["why"].startswith("eve (CONTRIBUTOR) may not use")


def test_roles_and_listed_users_need_no_team_lookup(
        repo: Path, tmp_path: Path, github: tuple[str, list[dict[str, Any]]]) -> None:
    api, seen = github
    for actor, association, why in (("olga", "OWNER", "OWNER may"), ("carol", "NONE", "carol is listed")):
        decision = _decide(repo, tmp_path, "/run-ci run-ci-train", actor, association, api)
        assert decision["verdict"] == "allowed" and decision["why"] == why
    helped = _decide(repo, tmp_path, "/help", "dave", "NONE", api, TOKEN)  # /help asks about every team
    assert "/run-ci <label>" in helped["reply"]
    assert [s["path"] for s in seen] == ["/orgs/acme/teams/gpu-ci/memberships/dave"]


def _act(job_id: str, decision: dict[str, Any], tmp_path: Path,
         results: dict[str, str] | None = None) -> list[list[str]] | None:
    """Run one acting job if its `if:` holds for the decision; the gh calls it made, else None."""
    job = _jobs()[job_id]
    assert "actions/checkout" not in json.dumps(job)  # acting jobs run no repository code
    field = {"label": ["add_label"], "run": ["dispatch", "rerun_failed"], "answer": ["reaction"]}[job_id]
    for name in field:
        assert f"fromJSON(needs.decide.outputs.decision).{name}" in job["if"]
    if not any(decision.get(name) for name in field):
        return None
    bindir, calls = _gh(tmp_path)
    calls.unlink(missing_ok=True)
    (step,) = job["steps"]
    env = {"GH_TOKEN": "workflow-token", "REPO": "acme/slime", "PR": "7", "COMMENT_ID": "99",
           "DEFAULT_BRANCH": "main", "DECISION": json.dumps(decision), "RUN_URL": "https://x/runs/1",
           "LABELLED": "success", "RAN": "success", **(results or {})}
    _bash(step["run"], {k: env[k] for k in step["env"]}, tmp_path, tmp_path, bindir)
    return [json.loads(x) for x in calls.read_text(encoding="utf-8").splitlines()] if calls.exists() else []


def test_run_ci_adds_the_label_in_its_own_job_and_dispatches_the_suite(
        repo: Path, tmp_path: Path, github: tuple[str, list[dict[str, Any]]]) -> None:
    decision = _decide(repo, tmp_path, "/run-ci run-ci-train", "olga", "OWNER", github[0])
    assert [a["job"] for a in decision["actions"]] == ["label", "run", "answer"]
    assert _act("label", decision, tmp_path) == [
        ["api", "repos/acme/slime/issues/7/labels", "-f", "labels[]=run-ci-train"]]
    assert _act("run", decision, tmp_path) == [
        ["workflow", "run", "run-ci-file.yml", "--repo", "acme/slime", "--ref", "main",
         "-f", "pr=7", "-f", f"sha={SHA}", "-f", "suite=train", "-f", "only="]]
    react, reply = _act("answer", decision, tmp_path) or []
    assert react == ["api", "repos/acme/slime/issues/comments/99/reactions", "-f", "content=rocket"]
    assert reply[:2] == ["api", "repos/acme/slime/issues/7/comments"]
    assert reply[3] == f"body=Label run-ci-train added; running `nox -s train` on {SHA} now (later " \
                       "pushes run it through the label)."
    failed = _act("answer", decision, tmp_path, {"LABELLED": "failure"}) or []
    assert failed[1][3].endswith("(but a gateway job failed: https://x/runs/1)")
    # Each job has the one write permission it needs; deciding has none.
    jobs = _jobs()
    assert jobs["decide"]["permissions"] == {"contents": "read", "pull-requests": "read"}
    assert jobs["label"]["permissions"] == {"pull-requests": "write"}
    assert jobs["run"]["permissions"] == {"actions": "write"}
    assert jobs["answer"]["permissions"] == {"issues": "write"}
    assert "secrets." not in json.dumps({k: v for k, v in jobs.items() if k != "decide"})


def test_a_refused_command_labels_and_runs_nothing_but_answers(
        repo: Path, tmp_path: Path, github: tuple[str, list[dict[str, Any]]]) -> None:
    decision = _decide(repo, tmp_path, "/run-ci run-ci-train", "olga", "OWNER", github[0], fork=True)
    assert decision["verdict"] == "refused" and "from a fork" in decision["why"]
    assert _act("label", decision, tmp_path) is None and _act("run", decision, tmp_path) is None
    react, reply = _act("answer", decision, tmp_path) or []
    assert react[-1] == "content=confused" and reply[3] == f"body=Not run: {decision['why']}."
    ignored = _decide(repo, tmp_path, "/ just a slash", "olga", "OWNER", github[0])
    assert ignored["verdict"] == "refused"  # a slash that is no known command is malformed
    quiet = _decide(repo, tmp_path, "lgtm\n/run-ci run-ci-train", "olga", "OWNER", github[0])
    assert quiet["verdict"] == "ignored" and _act("answer", quiet, tmp_path) is None


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
