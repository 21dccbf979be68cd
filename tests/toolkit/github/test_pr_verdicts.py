"""`python -m ci why`, the sticky verdict comment and the `verdict` gate, on planted histories
in real SQLite files and a real PostgreSQL server.

GitHub's API is the loopback stand-in of tests/toolkit/_github_api.py (this machine has no
GitHub); the store, the registry, the command and its exit codes are the real ones.
"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci, write
from _github_api import env_for, fake_github
from _verdict_store import attempt as _try
from _verdict_store import plant_main, plant_push, registry, run, why_command

from ci.github.pr_verdicts import MARKER, rule_table
from ci.history.store import open_store

NUM_GPUS = 0


@pytest.fixture
def why(capsys, monkeypatch):
    """`python -m ci why …` in this process (one subprocess test below runs it as a user would)."""
    return why_command(capsys, monkeypatch)


def test_each_kind_gets_its_verdict_and_evidence_and_only_new_and_unknown_block(store_url, tmp_path, why):
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry()})
    plant_main(store_url)
    plant_push(store_url, 1)
    proc = why(root, store_url, "--pr", "42", "--base", "m5000000000", "--json", "--gate")
    assert proc.returncode == 1, proc.stderr
    got = {Path(v["entry_id"]).stem[5:]: v for v in json.loads(proc.stdout)}
    assert {k: (v["kind"], v["rule"]) for k, v in got.items()} == {
        "new": ("new", "new"), "main": ("already-failing", "main-broken"), "flaky": ("flaky", "flaky-retry"),
        "infra": ("infrastructure", "node-lost"), "fresh": ("unknown", "no-history")}
    assert {k for k, v in got.items() if v["blocks"]} == {"new", "fresh"}
    assert "passed on main at m600000000" in got["new"]["evidence"]
    assert "bisect m300000000..m400000000" in got["main"]["evidence"]
    assert "then passed on attempt 2" in got["flaky"]["evidence"]
    assert "node gpu-7 lost" in got["infra"]["evidence"]
    assert "blocking verdict(s): gpu: tests/e2e/test_fresh.py (unknown), gpu: tests/e2e/test_new.py (new)" \
        in proc.stderr


def test_a_suite_that_blocks_on_new_only_fails_the_gate_for_the_new_one_alone(store_url, tmp_path, why):
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry(', verdict_blocks=("new",)')})
    plant_main(store_url)
    plant_push(store_url, 1)
    proc = why(root, store_url, "--pr", "42", "--base", "m5000000000", "--gate")
    assert proc.returncode == 1 and "blocking verdict(s): gpu: tests/e2e/test_new.py (new)\n" in proc.stderr
    text = proc.stdout
    for line in ("tests/e2e/test_new.py: new (blocks) [rule new]",
                 "tests/e2e/test_main.py: already failing on main [rule main-broken]",
                 "tests/e2e/test_flaky.py: flaky [rule flaky-retry]",
                 "tests/e2e/test_infra.py: infrastructure [rule node-lost]",
                 "tests/e2e/test_fresh.py: unknown [rule no-history]"):
        assert line in text, text


def test_the_gate_passes_what_is_not_the_prs_doing(tmp_path, why):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry()})
    plant_main(url)
    with open_store(url) as store:
        store.record(run("pr-x", "pxffffffff", 2000.0, [
            _try("main", "failed", reason="AssertionError: broken on main"),
            _try("infra", "failed", reason="docker: Error response from daemon: pull access denied", code=125),
            _try("ok", "passed")], branch="feature", pr=7, backend="docker slime:latest"))
    proc = why(root, url, "--pr", "7", "--gate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "infrastructure [rule image-pull]" in proc.stdout and "already failing on main" in proc.stdout
    assert "No merge base given" in proc.stdout or "latest trusted runs" in proc.stdout
    nothing = why(root, url, "--pr", "8", "--gate")
    assert nothing.returncode == 0 and "Nothing of PR #8 is recorded" in nothing.stdout


def test_a_failed_job_with_nothing_recorded_is_unknown_and_blocks(tmp_path, why):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry()})
    plant_main(url)
    needs = json.dumps({"gpu": {"result": "failure", "outputs": {}}, "lint": {"result": "success"},
                        "plan": {"result": "success", "outputs": {"jobs": '["gpu", "lint"]'}}})
    proc = why(root, url, "--pr", "9", "--gate", "--needs", needs)
    assert proc.returncode == 1 and "gpu: (job gpu): unknown (blocks) [rule job-unrecorded]" in proc.stdout
    plant_push(url, 1, pr=9)  # now the job's failures are recorded: they speak for it
    proc = why(root, url, "--pr", "9", "--json", "--needs", needs)
    assert "job-unrecorded" not in proc.stdout
    assert why(root, url, "--pr", "9", "--needs", "[1,").returncode == 2


def test_one_sticky_comment_after_three_pushes_and_the_step_summary(store_url, tmp_path, why):
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry()})
    summary = tmp_path / "summary.md"
    plant_main(store_url)
    with fake_github() as (api, gh):
        gh.comments[42] = [{"id": 1, "body": "LGTM, but CI is red"}]  # someone else's comment stays
        for push in (1, 2, 3):
            commit = plant_push(store_url, push)
            proc = why(root, store_url, "--pr", "42", "--base", "m5000000000", "--comment", "--gate",
                        env={**env_for(api), "GITHUB_STEP_SUMMARY": str(summary)})
            assert proc.returncode == 1, proc.stderr
            assert ("posted comment" if push == 1 else "updated comment") in proc.stdout
        ours = [c for c in gh.comments[42] if c["body"].startswith(MARKER)]
        assert len(ours) == 1 and len(gh.comments[42]) == 2, gh.comments
        body = ours[0]["body"]
    assert f"at `{commit[:10]}`" in body, "the comment shows the newest push"
    assert "**verdict: fail.** 2 of 5 failed entries block the merge" in body
    assert "| `tests/e2e/test_new.py` | **new** :x: (rule `new`) |" in body
    for row in ("| `tests/e2e/test_main.py` | already failing on main (rule `main-broken`) | `failed: AssertionError: "
                "broken on main`; `failing on main since m400000000",
                "| `tests/e2e/test_flaky.py` | flaky (rule `flaky-retry`) | `flaky: TimeoutError: rollout stalled`; "
                "`failed 1 time(s) here",
                "| `tests/e2e/test_infra.py` | infrastructure (rule `node-lost`) | `lost: node gpu-7 lost mid-entry`;",
                "| `tests/e2e/test_fresh.py` | **unknown** :x: (rule `no-history`) |"):
        assert row in body, (row, body)
    assert "test_ok.py" not in body, "an entry that passed plainly gets no verdict"
    assert "`nox -s gpu -- --emulate-gpus --only tests/e2e/test_new.py`" in body
    assert "comment `/rerun-failed`" in body  # the infrastructure's entry: rerun, nothing to debug
    assert "#### `gpu` (blocks on: new, unknown)" in body
    assert summary.read_text().count(MARKER) == 3, "each run writes the same table to its step summary"


def test_a_read_only_token_still_gates_and_says_the_comment_was_not_written(tmp_path, why):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry()})
    plant_main(url)
    plant_push(url, 1)
    with fake_github() as (api, gh):
        gh.refuse_writes = True
        proc = why(root, url, "--pr", "42", "--comment", "--gate", env=env_for(api))
    assert proc.returncode == 1
    assert "warning: the verdict comment was not written (GitHub answered HTTP 403" in proc.stderr


def test_why_for_one_run_and_bad_input(tmp_path, why):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry()})
    plant_main(url)
    plant_push(url, 1)
    proc = why(root, url, "--run", "pr-1")
    assert proc.returncode == 0 and "tests/e2e/test_new.py: new (blocks) [rule new]" in proc.stdout, proc.stderr
    for args, text in [(("--run", "nope"), "no run 'nope' in the history"),
                       (("--run", "main"), "matches 6 runs"),
                       (("--comment", "--run", "pr-1"), "--comment needs --pr N"),
                       (("--pr", "42", "--comment"), "set GITHUB_TOKEN"),
                       (("--pr", "1", "--run", "x"), "not allowed with argument")]:
        bad = why(root, url, *args, env={"GITHUB_TOKEN": ""})
        assert bad.returncode == 2 and text in bad.stderr and bad.stderr.count("\n") == 1, (args, bad.stderr)
    wrong = write(tmp_path / "wrong", {"ci/registry/repo_suites.py": registry(', verdict_blocks=("bad",)')})
    bad = run_ci("why", "--history", url, "--root", str(wrong), "--pr", "42")  # as a user runs it
    assert bad.returncode == 2 and "verdict_blocks names 'bad'" in bad.stderr and bad.stderr.count("\n") == 1
    gated = run_ci("why", "--history", url, "--root", str(root), "--pr", "42", "--gate")
    assert gated.returncode == 1 and "test_new.py: new (blocks)" in gated.stdout


def test_the_docs_carry_the_rule_table():
    docs = (Path(__file__).resolve().parents[3] / "docs/verdicts.md").read_text(encoding="utf-8")
    assert rule_table() in docs, "docs/verdicts.md: paste `python -c 'from ci.github.pr_verdicts import " \
                                 "rule_table; print(rule_table())'`"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
