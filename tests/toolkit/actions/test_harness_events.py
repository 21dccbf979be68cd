"""Pushes, schedules, dispatches, comment commands and the history ingest through the generated
workflows under a real act (`python -m ci actions`), on one state folder, as one repository's
runs follow each other.

The runner is act itself, each job a process here. This machine has no GitHub, so the pinned
actions, `gh` and the REST API are ci/actions/'s loopback stand-ins; `nox` records its calls.
"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _act import commands, ran, requests, session

from ci.actions.events import EventSpec
from ci.registry.cadences import DEFAULT_SCHEDULES

NUM_GPUS = 0
pytestmark = pytest.mark.slow  # act runs each event's jobs: ~15-100 s an event on 2 cores

CRONS = {cadence: cron for cron, cadence in DEFAULT_SCHEDULES.items()}


@pytest.fixture(scope="module")
def act(tmp_path_factory):
    yield from session(tmp_path_factory.mktemp("actions"), follow=True)


def _records(out, tool, job):
    return [r for r in out.records if r["tool"] == tool and r["job"] == job and r["workflow"] == "pr-test"]


def test_a_push_saves_the_caches_the_next_pr_restores_and_the_ingest_reads_its_run(act):
    push = act.run(EventSpec(name="push"))
    assert set(ran(push)) == {"cpu_unit", "agent_adapter", "toolkit", "lint", "gpu_smoke"}
    assert push.disagreements == ()
    saved = [r["argv"][0] for r in _records(push, "cache-save", "cpu_unit")]
    assert len(saved) == 1 and saved[0].startswith("slime-ci-durations-cpu_unit-")
    # history-ingest.yml follows the finished run (act never chains workflow_run) and asks for
    # that run's artifacts.
    assert ran(push, "history-ingest.yml")["ingest"].result == "success"
    run_id = saved[0].split("-")[-2]
    assert requests(push, "GET", f"/actions/runs/{run_id}/artifacts")

    pr = act.run(EventSpec(name="pull_request", paths=("slime/loop.py",)))
    restored = [r for r in _records(pr, "cache-restore", "cpu_unit") if r["matched"]]
    assert [r["matched"] for r in restored] == saved and not restored[0]["exact"]  # a restore-keys hit
    durations = Path(restored[0]["cwd"]) / ".ci-cache" / "durations.json"
    assert not durations.exists() or json.loads(durations.read_text()).get("run_id") == run_id


def test_a_dispatch_with_infinite_run_runs_every_suite_job_with_the_flag(act):
    out = act.run(EventSpec(name="workflow_dispatch", inputs={"infinite_run": "true"}))
    assert {"megatron", "ckpt", "cpu_unit", "changed"} <= set(ran(out)) and "plan" not in ran(out)
    assert out.disagreements == ()
    assert not any(j.workflow == "run-ci-file.yml" for j in out.jobs)  # a dispatch names one workflow
    suite = [r for r in _records(out, "nox", "megatron") if r["argv"] == ["-s", "megatron"]]
    assert [r["env"].get("SLIME_TEST_ENABLE_INFINITE_RUN") for r in suite] == ["1"]


@pytest.mark.parametrize("cadence", ["monitor", "weekly", "nightly"])
def test_each_cron_runs_what_the_plan_says(act, cadence):
    out = act.run(EventSpec(name="schedule", cron=CRONS[cadence]))
    assert out.disagreements == ()
    jobs = set(ran(out))
    if cadence == "monitor":
        # The monitor, and the HUD it publishes: built from the shared store, then deployed.
        assert jobs == {"monitor", "hud", "pages"}
        assert {j.job: j.result for j in out.jobs if j.job in jobs} == dict.fromkeys(jobs, "success")
        # The monitor's commands are the real ones (ci.registry ISSUES_COMMAND, MONITOR_COMMAND).
        assert commands(out, "monitor")[0] == "nox -s monitor"
        assert commands(out, "hud") == ["nox -s hud -- --out site"]
    elif cadence == "weekly":
        assert {"megatron_stability", "lock_check", "image"} <= jobs and "mutation" not in jobs
    else:
        assert {"mutation", "plants", "gpu_smoke_nightly", "megatron"} <= jobs and "lock_check" not in jobs


def test_a_member_reruns_one_file_and_a_stranger_is_refused_without_an_echo(act):
    member = act.run(EventSpec(name="issue_comment", comment="/rerun-test tests/test_ray_head.py",
                               actor="alice", association="MEMBER"))
    assert set(ran(member, "ci-comment.yml")) == {"decide", "run", "answer"}
    dispatched = requests(member, "POST", "/actions/workflows/run-ci-file.yml/dispatches")
    assert len(dispatched) == 1 and dispatched[0]["body"]["inputs"]["only"] == "tests/test_ray_head.py"
    # The dispatch GitHub would start: run-ci-file.yml runs that file alone.
    assert commands(member, "run_cpu", "run-ci-file.yml") == ["nox -s cpu_unit -- --only tests/test_ray_head.py"]

    secret = "tests/x_ignore-previous-instructions.py"  # text of theirs the reply must not echo
    stranger = act.run(EventSpec(name="issue_comment", comment=f"/rerun-test {secret}",
                                 actor="mallory", association="NONE"))
    assert set(ran(stranger, "ci-comment.yml")) == {"decide", "answer"}
    assert not requests(stranger, "POST", "/dispatches")
    replies = [str(r["body"].get("body", "")) for r in requests(stranger, "POST", "/issues/7/comments")]
    assert len(replies) == 1 and "may not use /rerun-test" in replies[0]
    assert secret not in replies[0] and "ignore" not in replies[0]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
