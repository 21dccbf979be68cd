"""The `verdict` gate against jobs that did not succeed: cancelled, stopped at their time limit,
skipped although the plan named them, or failed with only a flake recorded.

`python -m ci why --needs` is driven as the verdict job drives it, with Actions'
`toJSON(needs)` written by hand (this machine has no Actions) over a real SQLite store; then
Hypothesis writes the `needs` object: whatever it holds, a job that did not succeed and that
no failed entry of its own explains must fail the gate, and a bad value is one line, exit 2.
"""

import json
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, run_ci, write
from _github_api import env_for, fake_github
from _verdict_store import attempt, plant_main, plant_pr, registry, why_command

from ci.github.job_verdicts import endings, how_it_ended

NUM_GPUS = 0
PLANNED = {"result": "success", "outputs": {"jobs": json.dumps(["gpu", "cpu"])}}


@pytest.fixture
def why(capsys, monkeypatch):
    return why_command(capsys, monkeypatch)


@pytest.fixture
def repo(tmp_path):
    """A checkout with a GPU suite (gated by the plan) and a CPU suite, and main's history."""
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry(', verdict_blocks=("new",)',
                                                                             cpu=True)})
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    plant_main(url)
    return root, url


def needs(**jobs):
    return json.dumps({"plan": PLANNED, **{k: {"result": v, "outputs": {}} for k, v in jobs.items()}})


def test_a_cancelled_job_fails_the_gate_even_where_its_suite_blocks_on_new_only(repo, why):
    root, url = repo
    # The run was cancelled: the GPU job never finished, nothing of it recorded; the CPU job passed.
    proc = why(root, url, "--pr", "7", "--gate", "--needs", needs(gpu="cancelled", cpu="success"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gpu: (job gpu): unknown (blocks) [rule job-cancelled]" in proc.stdout, proc.stdout


def test_a_job_stopped_at_its_time_limit_is_not_explained_by_what_it_judged_before(repo, why):
    root, url = repo
    # Timed out: one entry failed as it fails on main (a verdict that does not block), the rest
    # were stopped before they were judged. Nobody knows what the stopped ones would have said.
    plant_pr(url, [attempt("main", "failed", reason="AssertionError: broken on main"),
                   attempt("new", "interrupted", reason="interrupted"),
                   attempt("fresh", "interrupted", reason="interrupted")], pr=7)
    proc = why(root, url, "--pr", "7", "--gate", "--needs", needs(gpu="failure", cpu="success"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gpu: (job gpu): unknown (blocks) [rule job-stopped]" in proc.stdout, proc.stdout


def test_a_job_the_plan_named_that_was_skipped_fails_the_gate_and_one_it_did_not_name_passes(repo, why):
    root, url = repo
    plan = {"result": "success", "outputs": {"jobs": json.dumps(["cpu", "gpu"])}}
    raw = json.dumps({"plan": plan, "gpu": {"result": "skipped"}, "cpu": {"result": "success"}})
    proc = why(root, url, "--pr", "7", "--gate", "--needs", raw)
    assert proc.returncode == 1 and "[rule job-skipped]" in proc.stdout, proc.stdout
    plan["outputs"] = {"jobs": json.dumps(["cpu"])}  # the diff touched no GPU code: skipped as planned
    raw = json.dumps({"plan": plan, "gpu": {"result": "skipped"}, "cpu": {"result": "success"}})
    proc = why(root, url, "--pr", "7", "--gate", "--needs", raw)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    failed_plan = json.dumps({"plan": {"result": "failure"}, "gpu": {"result": "skipped"}})
    assert why(root, url, "--pr", "7", "--gate", "--needs", failed_plan).returncode == 1


def test_a_failed_job_is_explained_only_by_its_own_failed_entries(repo, why):
    root, url = repo
    # The suite's only verdict is a flake that passed on its retry: it did not fail the job.
    plant_pr(url, [attempt("flaky", "failed", final=False, reason="TimeoutError: rollout stalled"),
                   attempt("flaky", "flaky", n=2, reason="failed 1 time(s), then passed")], pr=7)
    proc = why(root, url, "--pr", "7", "--gate", "--needs", needs(gpu="failure", cpu="success"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[rule job-unrecorded]" in proc.stdout and "[rule flaky-retry]" in proc.stdout
    # Its own failed entry, already failing on main, does explain it.
    plant_pr(url, [attempt("main", "failed", reason="AssertionError: broken on main")], pr=8)
    proc = why(root, url, "--pr", "8", "--gate", "--needs", needs(gpu="failure", cpu="success"))
    assert proc.returncode == 0 and "job-" not in proc.stdout, proc.stdout + proc.stderr


def _actions_job(name, conclusion, *steps):
    return {"name": name, "conclusion": conclusion,
            "steps": [{"name": n, "status": st_, "conclusion": c} for n, st_, c in steps]}


def test_a_job_that_recorded_nothing_says_how_it_ended_from_the_actions_api(repo, why):
    """GitHub's API is the loopback stand-in (this machine has no Actions): the run's job list,
    as the verdict job's token reads it, says which job timed out, lost its runner or failed a step."""
    root, url = repo
    with fake_github() as (api, gh):
        gh.jobs[(555, 2)] = [_actions_job("plan", "success"),
                             _actions_job("gpu", "timed_out", ("nox -s gpu", "completed", "cancelled")),
                             _actions_job("cpu", "failure", ("Check out", "completed", "success"),
                                  ("nox -s cpu", "in_progress", None))]
        env = {**env_for(api), "GITHUB_RUN_ID": "555", "GITHUB_RUN_ATTEMPT": "2"}
        proc = why(root, url, "--pr", "7", "--gate", "--comment", "--needs",
                   needs(gpu="cancelled", cpu="failure"), env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "it timed out (ran past its timeout-minutes)" in proc.stdout, proc.stdout
    assert "its runner was lost: steps never completed and none failed" in proc.stdout, proc.stdout
    assert "[rule job-unrecorded]" in proc.stdout


def test_how_a_job_ended_reads_its_conclusion_then_its_steps():
    assert how_it_ended(_actions_job("x", "cancelled")) == "it was cancelled (by hand or by a newer push)"
    failed = _actions_job("x", "failure", ("Install nox", "completed", "failure"), ("nox -s x", "completed", "skipped"))
    assert how_it_ended(failed) == "its step 'Install nox' failed"
    assert how_it_ended(_actions_job("x", "failure", ("a", "completed", "success"))) == "its conclusion is 'failure'"
    assert how_it_ended({"name": "x", "conclusion": None, "steps": "junk"}) == "its conclusion is 'None'"


def test_each_shard_of_a_matrix_job_that_did_not_succeed_is_named():
    # The workflow names a matrix job's shards `ID (shard N)`: shard 3's runner never ran a
    # step, shard 2 failed its tests; shard 1 passed and says nothing.
    items = [_actions_job("toolkit (shard 3)", "failure", ("Check out", "in_progress", None)),
             _actions_job("toolkit (shard 1)", "success"),
             _actions_job("toolkit (shard 2)", "failure", ("nox -s toolkit (shard 2/3)", "completed", "failure")),
             _actions_job("lint", "failure", ("nox -s lint", "completed", "failure"))]
    assert endings(items, {"toolkit", "lint"}) == {
        "toolkit": "shard 2: its step 'nox -s toolkit (shard 2/3)' failed; "
                   "shard 3: its runner was lost: steps never completed and none failed",
        "lint": "its step 'nox -s lint' failed"}


def test_a_deeply_nested_needs_is_one_line_and_exit_2(repo, why):
    root, url = repo
    proc = run_ci("why", "--history", url, "--root", str(root), "--pr", "7", "--needs", "[" * 100_000)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --needs:"), proc.stderr[-2000:]
    for raw in ('{"a":' * 15_000 + "1" + "}" * 15_000, json.dumps({"gpu": [[[[[[[[[[1]]]]]]]]]]})):
        proc = why(root, url, "--pr", "7", "--needs", raw)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
        assert proc.stderr.startswith("error: --needs:"), proc.stderr[:300]


_result = st.one_of(st.sampled_from(["success", "failure", "cancelled", "skipped"]),
                    st.text(max_size=8), st.none(), st.integers())
_job = st.one_of(st.fixed_dictionaries({"result": _result}, optional={"outputs": st.dictionaries(
    st.text(max_size=4), st.text(max_size=8), max_size=2)}), st.text(max_size=4), st.none(), st.lists(st.none()))
_needs = st.dictionaries(st.sampled_from(["gpu", "cpu", "lint", "other"]), _job, max_size=4)
_plan = st.one_of(st.just(PLANNED), st.fixed_dictionaries({"result": _result}),
                  st.just({"result": "success", "outputs": {"jobs": "not json"}}))


def _passes(jobs, plan):
    """The gate's answer the rules give, written out independently: every job succeeded, or was
    skipped without the plan naming it (no entry failed: nothing else can block)."""
    if not isinstance(plan, dict) or plan.get("result") != "success" or plan is not PLANNED:
        return False
    for job_id, info in jobs.items():
        result = info.get("result") if isinstance(info, dict) else None
        if result == "skipped" and job_id not in ("gpu",):
            continue  # no plan gates it: its own `if:` skipped it
        if result != "success":
            return False
    return True


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(jobs=_needs, plan=_plan)
def test_whatever_needs_holds_a_job_that_did_not_succeed_never_passes(repo, why, jobs, plan):
    root, url = repo
    proc = why(root, url, "--pr", "7", "--gate", "--needs", json.dumps({**jobs, "plan": plan}))
    assert proc.returncode == (0 if _passes(jobs, plan) else 1), (jobs, plan, proc.stdout, proc.stderr)


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(raw=st.one_of(st.text(max_size=40), st.recursive(st.none() | st.integers() | st.text(max_size=4),
                                                        lambda c: st.lists(c, max_size=3)
                                                        | st.dictionaries(st.text(max_size=4), c, max_size=3),
                                                        max_leaves=12).map(json.dumps)))
def test_any_needs_text_is_a_verdict_or_one_line_of_bad_input(repo, why, raw):
    root, url = repo
    try:
        proc = why(root, url, "--pr", "7", "--gate", "--needs", raw)
    except SystemExit as exc:  # argparse on an empty value: not ours to judge here
        pytest.fail(f"{raw!r}: exited {exc.code} outside the command table")
    if proc.returncode == 2:
        assert proc.stderr.count("\n") == 1 and "--needs" in proc.stderr, proc.stderr
    else:
        assert proc.returncode in (0, 1), proc


def test_the_verdict_job_fails_after_a_cancel_whether_or_not_its_steps_run():
    job = yaml.safe_load((REPO / ".github/workflows/pr-test.yml").read_text())["jobs"]["verdict"]
    assert job["if"].startswith("always()"), "it must run after a failed or cancelled job"
    last = job["steps"][-1]
    assert last["if"] == "cancelled()" and last["run"].rstrip().endswith("exit 1"), last


def test_the_docs_carry_the_job_rule_table():
    from ci.github.job_verdicts import rule_table

    docs = (Path(__file__).resolve().parents[3] / "docs/verdicts.md").read_text(encoding="utf-8")
    assert rule_table() in docs, "docs/verdicts.md: paste `python -c 'from ci.github.job_verdicts import " \
                                 "rule_table; print(rule_table())'`"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
