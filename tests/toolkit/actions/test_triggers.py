"""What act does not do, done by `python -m ci actions` (ci/actions/triggers.py, stand_ins.py,
act_argv.py, harness.parse_log): the `on:` filters, the ignored keys, unmapped actions, an
empty matrix. Pure functions over this repository's generated workflows; no act run here.
"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

from ci.actions import act_argv, harness, parity, stand_ins, triggers
from ci.errors import UsageError

NUM_GPUS = 0


def _workflows() -> dict[str, triggers.Workflow]:
    return {w.file: w for w in triggers.load(REPO)}


def test_on_filters_as_github_applies_them():
    w = _workflows()
    pr, ingest, comment = w["pr-test.yml"], w["history-ingest.yml"], w["ci-comment.yml"]
    assert triggers.starts(pr, triggers.Trigger(event="pull_request", action="labeled", branch="main"))[0]
    closed = triggers.starts(pr, triggers.Trigger(event="pull_request", action="closed", branch="main"))
    assert closed == (False, "types ['opened', 'synchronize', 'reopened', 'labeled'] lack closed")
    assert not triggers.starts(pr, triggers.Trigger(event="push", branch="release"))[0]
    assert triggers.starts(pr, triggers.Trigger(event="schedule", cron="23 * * * *"))[0]
    assert not triggers.starts(pr, triggers.Trigger(event="schedule", cron="0 0 * * *"))[0]
    assert triggers.starts(ingest, triggers.Trigger(event="workflow_run", workflow="pr-test"))[0]
    assert not triggers.starts(ingest, triggers.Trigger(event="workflow_run", workflow="pr-test history ingest"))[0]
    assert triggers.starts(comment, triggers.Trigger(event="issue_comment", action="created"))[0]
    assert not triggers.starts(comment, triggers.Trigger(event="pull_request", action="opened"))[0]


def test_the_generated_workflows_set_every_key_act_ignores():
    findings = [f for w in _workflows().values() for f in triggers.static_findings(w)]
    assert findings == []


def test_a_missing_timeout_a_secret_without_environment_are_found():
    doc = {"name": "x", "on": {"push": None}, "jobs": {
        "a": {"runs-on": "ubuntu-latest", "permissions": {}, "steps": [
            {"run": "echo", "env": {"X": "${{ secrets.SLIME_CI_HISTORY_URL }}"}}]},
        "b": {"runs-on": "ubuntu-latest", "timeout-minutes": 5, "permissions": "write-all",
              "environment": "e", "steps": [{"run": "echo ${{ secrets.S }}"}]}}}
    found = triggers.static_findings(triggers.Workflow(file="x.yml", name="x", doc=doc))
    assert found == ["x.yml job a: no timeout-minutes (GitHub's default is 360)",
                     "x.yml job a: reads secrets SLIME_CI_HISTORY_URL without an environment",
                     "x.yml job b: permissions write-all; name each scope it needs"]


def test_act_gets_no_environment_key_and_on_by_name():
    pr = _workflows()["pr-test.yml"]
    doc = triggers.for_act(pr)
    assert "on" in doc and True not in doc
    assert all("environment" not in j for j in doc["jobs"].values())
    assert "environment" in pr.jobs["monitor"]  # the parsed workflow keeps it for the static check


def test_every_action_the_workflows_use_has_a_stand_in_and_others_fail_by_name():
    used = stand_ins.used_actions({w.file: w.doc for w in _workflows().values()})
    assert {u for _, u, _ in used} == {s.uses for s in stand_ins.STAND_INS}
    stand_ins.check_mapped(used)
    with pytest.raises(UsageError, match=r"x.yml: no local stand-in for `uses: actions/cache@" + "0" * 40):
        stand_ins.check_mapped([("x.yml", "actions/cache", "0" * 40)])
    with pytest.raises(UsageError, match="not pinned to a full commit"):
        stand_ins.check_mapped([("x.yml", "actions/checkout", "v5")])
    with pytest.raises(UsageError, match="is not owner/repo@ref"):
        stand_ins.used_actions({"x.yml": {"jobs": {"a": {"steps": [{"uses": "./local"}]}}}})


def test_act_argv_maps_every_label_to_the_host_and_every_pin_to_a_folder(tmp_path):
    argv = act_argv.act_argv(act="act", event="pull_request", workflow_file=tmp_path / "w.yml",
                             event_file=tmp_path / "e.json", clone=tmp_path / "repo",
                             stand_ins=tmp_path / "s", action_cache=tmp_path / "c", run_id=7,
                             api_url="http://127.0.0.1:1", secrets={"A": "b"})
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "--platform"]
    assert pairs == ["ubuntu-latest=-self-hosted", "self-hosted=-self-hosted", "gpu=-self-hosted"]
    local = [argv[i + 1] for i, a in enumerate(argv) if a == "--local-repository"]
    assert f"actions/cache@{stand_ins.STAND_INS[2].ref}={tmp_path}/s/actions/cache/{stand_ins.STAND_INS[2].ref}" \
        in local and len(local) == len(stand_ins.STAND_INS) - 1  # cache restore and save share one
    assert argv[argv.index("GITHUB_RUN_ID=7") - 1:argv.index("GITHUB_RUN_ID=7") + 1] == ["--env", "GITHUB_RUN_ID=7"]
    assert argv[argv.index("--concurrent-jobs") + 1] == str(act_argv.CONCURRENT_JOBS) == "2"
    one = act_argv.act_argv(act="act", event="push", workflow_file=tmp_path / "w.yml", event_file=tmp_path / "e",
                            clone=tmp_path, stand_ins=tmp_path, action_cache=tmp_path, run_id=1, api_url="u",
                            secrets={}, concurrent_jobs=1)
    assert one[one.index("--concurrent-jobs") + 1] == "1"
    env = act_argv.act_env({"PATH": "/usr/bin", "GITHUB_TOKEN": "real", "HOME": "/root"},
                           shims=tmp_path / "bin", extra={"X": "1"})
    assert env == {"HOME": "/root", "PATH": f"{tmp_path}/bin:/usr/bin", "X": "1"}  # no host token


def test_an_empty_matrix_is_no_job_and_a_job_without_result_skipped():
    log = [json.dumps({"jobID": "m", "matrix": {}, "jobResult": "success"}),
           json.dumps({"jobID": "n", "matrix": {"v": 1}, "jobResult": "failure"}),
           json.dumps({"jobID": "n", "matrix": {"v": 2}, "jobResult": "success"}), "not json"]
    results = harness.parse_log(log)
    doc = {"jobs": {"m": {"strategy": {"matrix": "${{ fromJSON(needs.p.outputs.m) }}"}},
                    "n": {"strategy": {"matrix": {"v": [1, 2]}}}, "o": {"if": "false"}}}
    rows = harness.jobs_of(triggers.Workflow(file="w.yml", name="w", doc=doc), results, [], 1.0)
    assert [(r.job, r.status, r.result) for r in rows] == [
        ("m", "skipped", "skipped"), ("n", "ran", "failure"), ("o", "skipped", "skipped")]
    assert rows[0].why.startswith("empty matrix") and rows[2].why == "if: false"


def test_the_hud_jobs_are_expected_exactly_when_the_monitor_runs():
    monitor = parity.with_derived({"monitor": ["nox -s monitor"]})
    assert monitor == {"monitor": ["nox -s monitor"], "hud": ["nox -s hud -- --out site"], "pages": []}
    assert parity.with_derived({"cpu_unit": ["nox -s cpu_unit"]}) == {"cpu_unit": ["nox -s cpu_unit"]}
    ran = [harness.JobRun(workflow="pr-test.yml", job="hud", status="ran", result="success",
                          commands=("nox -s hud -- --out site",), why="")]
    assert parity.disagreements(ran, {}) == ["hud: act ran it, the plan does not"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
