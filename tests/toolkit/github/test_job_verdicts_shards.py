"""A sharded job's verdicts, as `python -m ci why` gives them: each shard records a run of its own
under the suite's name, and the verdicts read them as one suite, so a failed entry of shard 2 of 3
is that suite's and explains the matrix job's failure."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import write
from _verdict_store import attempt, plant_main, plant_pr, registry, why_command

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


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
