"""Pushes, schedules, dispatches, comment commands and the history ingest through the generated
workflows under a real act (`python -m ci actions`), on one state folder, as one repository's
runs follow each other.

The runner is act itself, each job a process here. This machine has no GitHub, so the pinned
actions, `gh` and the REST API are ci/actions/'s loopback stand-ins; `nox` records its calls.
"""

import hashlib
import json
import sys
import time
import uuid
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


def _plant_streak(url, entry):
    """Trusted runs of main in the shared store: `entry` passed once, then failed 3 runs in a row."""
    from ci.history.rows import AttemptRecord, RunRecord
    from ci.history.store import open_store

    now = time.time() + 3600  # after every run the module's earlier events recorded
    with open_store(url) as store:
        for i, outcome in enumerate(("passed", "failed", "failed", "failed")):
            at = now + i * 600
            store.record(RunRecord(
                uid=uuid.uuid4().hex, suite="cpu_unit", commit=hashlib.sha1(b"%d" % i).hexdigest(),
                branch="main", event="push", host="ci-cpu", hardware="cpu", started_at=at, ended_at=at + 60,
                exit_code=int(outcome == "failed"),
                attempts=(AttemptRecord(entry_id=entry, path=entry, attempt=1, final=True, outcome=outcome,
                                        passed=int(outcome == "passed"), failed=int(outcome == "failed"),
                                        seconds=2.0, exit_code=int(outcome == "failed"),
                                        **({"reason": "AssertionError: 3 != 4"} if outcome == "failed" else {})),)))
    return [hashlib.sha1(b"%d" % i).hexdigest() for i in range(4)]


def test_the_monitor_opens_the_issue_dispatches_the_bisect_and_publishes_the_hud(act):
    entry = "tests/test_ray_head.py"
    good, bad, *_ = _plant_streak(act.secrets["SLIME_CI_HISTORY_URL"], entry)
    out = act.run(EventSpec(name="schedule", cron=CRONS["monitor"]))
    assert out.disagreements == ()
    # The monitor, and the HUD it publishes: built from the shared store, then deployed.
    assert set(ran(out)) == {"monitor", "hud", "pages"}
    assert ran(out)["monitor"].result == "failure"  # `history monitor` exits 1: an entry is failing
    assert ran(out)["hud"].result == ran(out)["pages"].result == "success"
    # The monitor's commands are the real ones (ci.registry ISSUES_COMMAND, LEAK_ISSUES_COMMAND,
    # MONITOR_COMMAND: no record here, so no leak and no leak issue), then
    # the dispatch step that only a failing monitor runs.
    assert commands(out, "monitor")[0] == "nox -s monitor"
    assert commands(out, "hud") == ["nox -s hud -- --out site"]
    opened = requests(out, "POST", "/repos/acme/slime/issues")
    opened = [r for r in opened if str(r["path"]).endswith("/issues")]
    assert len(opened) == 1, [r["path"] for r in out.requests]
    body = opened[0]["body"]
    assert entry in body["title"] and bad[:7] in body["body"] and good[:7] in body["body"], body
    assert [i["title"] for i in out.github.issues] == [body["title"]]
    dispatched = requests(out, "POST", "/actions/workflows/bisect.yml/dispatches")
    assert [d["body"] for d in dispatched] == [{"ref": "main", "inputs": {
        "suite": "cpu_unit", "tier": "cpu", "entry": entry, "trigger": "monitor"}}]
    # The dispatch GitHub would start: bisect.yml's CPU job, on the streak the monitor found.
    bisect = {j.job: j for j in out.jobs if j.workflow == "bisect.yml"}
    assert bisect["bisect_cpu"].status == "ran" and bisect["bisect_gpu"].status == "skipped"
    install, run = commands(out, "bisect_cpu", "bisect.yml")
    assert install == "nox -s cpu_unit --install-only"  # then the session's Python runs the bisect
    assert run.startswith(f"python -m ci bisect --suite cpu_unit --entry {entry} --trigger monitor "
                          "--answer-dir .ci-cache/bisect --work-dir ") and run.endswith(" --from-monitor")
    assert bisect["bisect_cpu"].result == "success"


@pytest.mark.parametrize("cadence", ["weekly", "nightly"])
def test_each_cron_runs_what_the_plan_says(act, cadence):
    out = act.run(EventSpec(name="schedule", cron=CRONS[cadence]))
    assert out.disagreements == ()
    jobs = set(ran(out))
    if cadence == "weekly":
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
