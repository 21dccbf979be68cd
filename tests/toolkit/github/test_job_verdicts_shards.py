"""A sharded job's verdicts, as `python -m ci why` gives them: each shard records a run of its own
under the suite's name, and the verdicts read them as one suite, so a failed entry of shard 2 of 3
is that suite's and explains the matrix job's failure."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci, write
from _github_api import env_for, fake_github
from _verdict_store import attempt, plant_main, plant_pr, registry, why_command

from ci.github.job_verdicts import endings, planned_shards
from ci.history.store import open_store

NUM_GPUS = 0
PLANNED = {"result": "success", "outputs": {"jobs": json.dumps(["gpu"])}}


@pytest.fixture
def why(capsys, monkeypatch):
    return why_command(capsys, monkeypatch)


def test_a_failed_entry_of_one_shard_is_its_suites_and_explains_the_job(tmp_path, why):
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry(", shards=3")})
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    plant_main(url)
    # The matrix job's three shards, each its own run of the PR's commit (as each shard's
    # `history record` writes it): only shard 2 fails, with an entry that passes on main.
    plant_pr(url, [attempt("ok", "passed")], pr=7, uid="pr-7-shard-1")
    plant_pr(url, [attempt("new", "failed", reason="AssertionError: the PR broke it")], pr=7, uid="pr-7-shard-2")
    plant_pr(url, [attempt("infra", "passed")], pr=7, uid="pr-7-shard-3")
    needs = json.dumps({"plan": PLANNED, "gpu": {"result": "failure", "outputs": {}}})
    proc = why(root, url, "--pr", "7", "--gate", "--needs", needs)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gpu: tests/e2e/test_new.py: new (blocks)" in proc.stdout, proc.stdout
    # The shard's entry explains the job: no verdict of the job itself.
    assert "(job gpu)" not in proc.stdout, proc.stdout


def _leg(name, conclusion, *steps):
    return {"name": name, "conclusion": conclusion,
            "steps": [{"name": n, "status": st_, "conclusion": c} for n, st_, c in steps]}


def test_a_shard_the_plan_asked_for_that_never_ran_is_named(tmp_path, why):
    """GitHub's API is the loopback stand-in: the plan published three shards of `gpu`, the run
    lists two; shard 2 failed before it recorded anything, shard 3 has no job at all."""
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry(", shards=3")})
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    plant_main(url)
    plant_pr(url, [attempt("ok", "passed")], pr=7, uid="pr-7-shard-1")
    plan = {"result": "success", "outputs": {"jobs": json.dumps(["gpu"]),
                                             "shards": json.dumps({"gpu": {"shard": [1, 2, 3], "of": [3]}})}}
    needs = json.dumps({"plan": plan, "gpu": {"result": "failure", "outputs": {}}})
    with fake_github() as (api, gh):
        gh.jobs[(555, 1)] = [_leg("plan", "success"), _leg("gpu (shard 1)", "success"),
                             _leg("gpu (shard 2)", "failure", ("Install nox", "completed", "failure"))]
        env = {**env_for(api), "GITHUB_RUN_ID": "555", "GITHUB_RUN_ATTEMPT": "1"}
        proc = why(root, url, "--pr", "7", "--gate", "--comment", "--needs", needs, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("shard 2: its step 'Install nox' failed; "
            "shard 3 of 3: no job of it in the run (it never started)") in proc.stdout, proc.stdout
    assert "shard 1" not in proc.stdout.split("(job gpu)", 1)[-1].split("\n", 1)[0]


def test_the_plans_shards_are_read_from_its_output_or_not_at_all():
    ok = {"result": "success", "outputs": {"shards": json.dumps({"t": {"shard": [1, 2], "of": [2]}})}}
    assert planned_shards({"plan": ok}, "plan", "shards") == {"t": [1, 2]}
    for junk in ("", "[", "[1]", '{"t": [1, 2]}', '{"t": {"shard": ["1"]}}', "${{ steps.plan.outputs.shards }}"):
        plan = {"result": "success", "outputs": {"shards": junk}}
        assert planned_shards({"plan": plan}, "plan", "shards") == {}, junk
    assert planned_shards({"plan": {**ok, "result": "skipped"}}, "plan", "shards") == {}
    # A job the run lists no leg of (no matrix expanded) is not called missing shard by shard.
    assert endings([_leg("t", "failure")], {"t"}, {"t": [1, 2]}) == {"t": "its conclusion is 'failure'"}


def _shard_run(uid: str, entry: str, outcome: str) -> dict[str, object]:
    """One shard's exported run, as `history record --export` writes it (suite: the job's)."""
    now = time.time()
    return {"uid": uid, "suite": "toolkit", "commit": "c0ffee" * 6 + "c0ff", "branch": "feature",
            "event": "pull_request", "host": "h", "runner": "r", "backend": "local", "hardware": "cpu",
            "started_at": now - 60, "ended_at": now - 1, "exit_code": int(outcome != "passed"),
            "trusted": False, "pr": None,
            "attempts": [{"entry_id": entry, "path": entry, "attempt": 1, "final": True, "outcome": outcome,
                          "passed": int(outcome == "passed"), "failed": int(outcome != "passed"), "skipped": 0,
                          "num_gpus": 0, "devices": "", "node": "", "seconds": 2.0, "reason": ""}],
            "metrics": []}


def test_the_ingest_keeps_each_shards_run_under_the_one_suite(tmp_path):
    # The ingest job downloads one artifact per leg (history-toolkit-1, history-toolkit-2): both
    # runs land under `toolkit`, each with its own entries, and a re-run adds nothing.
    downloaded = tmp_path / "downloaded"
    for i, (entry, outcome) in enumerate((("tests/a.py", "passed"), ("tests/b.py", "failed")), 1):
        folder = downloaded / f"history-toolkit-{i}"
        folder.mkdir(parents=True)
        uid = f"{i:032x}"
        (folder / f"{uid}.json").write_text(json.dumps(_shard_run(uid, entry, outcome)))
    event = tmp_path / "event.json"
    event.write_text(json.dumps({
        "workflow_run": {"id": 777, "path": ".github/workflows/pr-test.yml", "event": "pull_request",
                         "head_branch": "feature", "head_sha": "c0ffee" * 6 + "c0ff",
                         "head_repository": {"full_name": "o/r"}, "pull_requests": [{"number": 12}],
                         "display_title": "t"},
        "repository": {"full_name": "o/r", "default_branch": "main"}}))
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    env = {**{k: "" for k in os.environ if k.startswith("GITHUB_")}, "SLIME_CI_HISTORY_URL": "",
           "GITHUB_OUTPUT": str(tmp_path / "outputs")}
    argv = ("history", "ingest", str(downloaded), "--event-file", str(event), "--history", url,
            "--root", str(tmp_path))
    done = run_ci(*argv, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 run(s), 2 new" in done.stdout, done.stdout
    with open_store(url) as store:
        assert sorted((r.suite, r.pr) for r in store.runs()) == [("toolkit", 12), ("toolkit", 12)]
        assert sorted((a.entry_id, a.outcome) for a in store.attempts(suite="toolkit")) == [
            ("tests/a.py", "passed"), ("tests/b.py", "failed")]
    again = run_ci(*argv, env=env)
    assert again.returncode == 0 and "2 run(s), 0 new" in again.stdout, again.stdout


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
