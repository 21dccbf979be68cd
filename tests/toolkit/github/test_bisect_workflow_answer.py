"""A GPU bisect's answer reaches the shared store through export -> ingest, and the monitor's
issue then names the culprit: on SQLite and on a real PostgreSQL server.

The bisect is the real `python -m ci bisect --from-monitor --export DIR` on the planted
repository of tests/toolkit/_bisect_repo.py (its 2-GPU entry on emulated GPUs), reading the
streak from a local SQLite file as a GPU runner reads the ingest job's snapshot; it holds
no store URL. The ingest is the real `history ingest` with a `workflow_run` event of the
bisect workflow written here (GitHub's own cannot exist in a test), in a checkout of the
planted repository (the commit graph that vouches for the answer's commits). GitHub's
issues API is the loopback stand-in of tests/toolkit/_github_api.py.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
import _bisect_repo as planted
from _ci import run_ci
from _github_api import REPO, env_for, fake_github
from _verdict_store import in_process

from ci.github.bisect_workflow import BISECT_PATH
from ci.history.bisects import bisects
from ci.history.ingest import BISECT_WORKFLOW
from ci.history.rows import AttemptRecord, RunRecord
from ci.history.store import open_store

NUM_GPUS = 0
PAIR = "tests/gpu/test_pair.py"


def streak(url, shas):
    """Main's runs as the monitor saw them: the entry passed at the good end, then failed
    three times at the tip."""
    with open_store(url) as store:
        for n, (sha, outcome) in enumerate([(shas[0], "passed")] + [(shas[-1], "failed")] * 3):
            store.record(RunRecord(
                uid=f"main-{n}", suite="gpu", commit=sha, branch="main", event="push", hardware="cuda",
                started_at=1_700_000_000.0 + n * 100, ended_at=1_700_000_001.0 + n * 100,
                exit_code=0 if outcome == "passed" else 1,
                attempts=(AttemptRecord(entry_id=PAIR, path=PAIR, attempt=1, final=True, outcome=outcome,
                                        seconds=1.0, reason="" if outcome == "passed" else "AssertionError"),)))


@pytest.fixture(scope="module")
def bisected(tmp_path_factory):
    """The GPU bisect job: its exported answer, the planted clone and its commits."""
    base = tmp_path_factory.mktemp("gpu-bisect")
    clone, shas = planted.build(tmp_path_factory.mktemp("planted"))
    snapshot = f"sqlite:///{base / 'snapshot.sqlite'}"  # the restored trusted snapshot
    streak(snapshot, shas)
    work = base / "steps"
    work.mkdir()
    env = {k: "" for k in os.environ if k.startswith("GITHUB_")}
    done = run_ci("bisect", "--from-monitor", "--entry", PAIR, "--emulate-gpus", "--history", snapshot,
                  "--root", str(clone.root), "--run-arg=--no-prefork", "--work-dir", str(work),
                  "--trigger", "monitor", "--export", str(base / "export"),
                  env={**env, "SLIME_CI_HISTORY_URL": ""}, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (answer,) = (base / "export").glob("*.json")
    return answer, clone, shas


def event(shas, *, workflow=BISECT_WORKFLOW, run_event="workflow_dispatch", head=None):
    return {"workflow_run": {"id": 4711, "path": workflow, "event": run_event, "head_branch": "main",
                             "head_sha": head or shas[-1], "head_repository": {"full_name": REPO},
                             "run_attempt": 1, "pull_requests": [], "display_title": "bisect"},
            "repository": {"full_name": REPO, "default_branch": "main"}}


def ingest(folder, payload, url, tmp_path, root):
    path = tmp_path / "event.json"
    path.write_text(json.dumps(payload))
    env = {k: "" for k in os.environ if k.startswith("GITHUB_")}
    return run_ci("history", "ingest", str(folder), "--event-file", str(path), "--history", url,
                  "--root", str(root), env={**env, "SLIME_CI_HISTORY_URL": ""})


def test_the_answer_is_exported_as_the_gpu_job_holds_no_store(bisected):
    answer, _, shas = bisected
    row = json.loads(answer.read_text())["bisect"]
    assert (row["kind"], row["commit"], row["good"], row["bad"], row["entry_id"], row["trigger"]) == (
        "first-bad", shas[planted.BREAK], shas[0], shas[-1], PAIR, "monitor")
    assert answer.name == f"{row['uid']}.json"


def test_the_ingested_answer_names_the_culprit_in_the_broken_main_issue(bisected, store_url, tmp_path,
                                                                         capsys, monkeypatch):
    answer, clone, shas = bisected
    streak(store_url, shas)  # the shared store holds main's runs, as the monitor reads them
    artifact = tmp_path / "downloaded"
    artifact.mkdir()
    shutil.copy(answer, artifact)
    done = ingest(artifact, event(shas), store_url, tmp_path, clone.root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 bisect answer(s), 1 new" in done.stdout, done.stdout
    again = ingest(artifact, event(shas), store_url, tmp_path, clone.root)  # a rerun ingest job
    assert again.returncode == 0 and "1 bisect answer(s), 0 new" in again.stdout, again.stdout
    with open_store(store_url) as store:
        [row] = bisects(store)
    assert (row.commit, row.bad, row.kind) == (shas[planted.BREAK], shas[-1], "first-bad")
    issues = in_process(capsys, monkeypatch, "issues")
    with fake_github() as (api, gh):
        opened = issues(clone.root, store_url, env=env_for(api))
        assert opened.returncode == 0, opened.stderr
        [broken] = [i for i in gh.issues if f"entry={PAIR} " in i["body"]]
    culprit = shas[planted.BREAK]
    assert f"- **culprit**: [{culprit[:10]}](https://github.com/{REPO}/commit/{culprit}), found by" in (
        broken["body"]), broken["body"]


@pytest.mark.parametrize(("case", "why"), [
    ("pr-run", "only a dispatch of .github/workflows/bisect.yml on the default branch"),
    ("other-file", "only a dispatch of .github/workflows/bisect.yml on the default branch"),
    ("off-branch", "not a commit of main"),
    ("extra-key", "has keys it must not (forged)"),
])
def test_an_answer_no_bisect_of_main_vouches_for_is_refused(bisected, tmp_path, case, why):
    answer, clone, shas = bisected
    data = json.loads(answer.read_text())
    payload = event(shas)
    if case == "pr-run":
        payload = event(shas, workflow=".github/workflows/pr-test.yml", run_event="pull_request")
        payload["workflow_run"]["pull_requests"] = [{"number": 12}]
    elif case == "other-file":
        payload = event(shas, workflow=".github/workflows/mine.yml")
    elif case == "off-branch":
        data["bisect"]["commit"] = "f" * 40
    else:
        data["bisect"]["forged"] = True
    folder = tmp_path / "downloaded"
    folder.mkdir()
    (folder / answer.name).write_text(json.dumps(data))
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    done = ingest(folder, payload, url, tmp_path, clone.root)
    assert done.returncode == 2, done.stdout + done.stderr
    assert why in done.stderr and "nothing ingested" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr
    assert not (tmp_path / "shared.sqlite").exists()


def test_the_ingest_names_the_bisect_workflow_as_it_is_generated():
    assert BISECT_PATH == BISECT_WORKFLOW


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
