"""The history ingest workflow: on `workflow_run`, the default branch's code, the one holder of
the store's secret for GPU runs, reading the artifacts the test workflows upload."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers

from ci.github.bisect_workflow import BISECT_PATH
from ci.github.gateway_workflow import RUN_FILE_PATH
from ci.github.ingest_workflow import INGEST_PATH
from ci.github.job_plan import table
from ci.github.workflow import WORKFLOW_PATH, exports_history, render
from ci.registry.repo_suites import SUITES
from ci.registry.workflow_style import Style

NUM_GPUS = 0


def test_it_watches_both_test_workflows_by_their_names_and_reads_what_they_upload() -> None:
    files = render(table())
    ingest = yaml.safe_load(files[INGEST_PATH])
    names = [yaml.safe_load(files[p])["name"] for p in (WORKFLOW_PATH, RUN_FILE_PATH, BISECT_PATH)]
    assert ingest["on"] == {"workflow_run": {"workflows": names, "types": ["completed"]}}
    # The GPU bisect holds no store URL: it exports its answer under the prefix fetched below.
    gpu_bisect = yaml.safe_load(files[BISECT_PATH])["jobs"]["bisect_gpu"]["steps"]
    [answer] = [s for s in gpu_bisect if s.get("name") == "Upload this job's runs for the history ingest"]
    assert answer["with"]["name"] == "history-bisect" and answer["with"]["path"] == ".ci-cache/history-export"
    assert "--export .ci-cache/history-export" in next(s["run"] for s in gpu_bisect
                                                       if s.get("name") == "python -m ci bisect")
    assert ingest["permissions"] == {}
    (job,) = ingest["jobs"].values()
    assert job["permissions"] == {"actions": "read"}  # downloads artifacts; writes nothing to GitHub
    assert job["environment"] == {"name": "ci-history", "deployment": False}
    steps = job["steps"]
    checkout, fetch, jobs, record = steps[0], steps[3], steps[4], steps[5]
    # The branch named in full (a tag `main` is not it), with its whole commit graph: a trusted
    # run's head must be one of its commits (ci/history/on_branch.py).
    assert checkout["with"] == {"ref": "refs/heads/${{ github.event.repository.default_branch }}",
                                "persist-credentials": False, "fetch-depth": 0, "filter": "blob:none"}
    # The finished run's artifacts, fetched as zip files and never unpacked (ingest reads them).
    assert fetch["env"]["RUN"] == "${{ github.event.workflow_run.id }}"
    assert "unzip" not in fetch["run"] and not any("download-artifact" in s.get("uses", "") for s in steps)
    assert '> "$RUNNER_TEMP/history/$id.zip"' in fetch["run"]
    # Every artifact a GPU job uploads has the prefix it fetches.
    prefix = "history-"
    assert f'startswith("{prefix}")' in fetch["run"]
    uploaded = [s["with"]["name"] for p in (WORKFLOW_PATH, RUN_FILE_PATH)
                for j in yaml.safe_load(files[p])["jobs"].values() for s in j["steps"]
                if s.get("name") == "Upload this job's runs for the history ingest"]
    assert len(uploaded) == sum(exports_history(j) for j in table()) + 1 and all(
        u.startswith(prefix) for u in uploaded)
    # Nothing from the artifact runs: the steps that run are the install, the fetch, the
    # ingest and the snapshot, all from the default branch's checkout.
    assert record["run"] == (
        'nox -s history -- ingest "$RUNNER_TEMP/history" --event-file "$GITHUB_EVENT_PATH" '
        f'--trusted-workflow {WORKFLOW_PATH} --jobs "$RUNNER_TEMP/jobs.jsonl"')  # only its own file trusted
    # The run attempt's jobs as GitHub timed them, a line each; a refusal is a warning, not a failure.
    assert jobs["env"]["RUN"] == fetch["env"]["RUN"] and jobs["env"]["ATTEMPT"] == (
        "${{ github.event.workflow_run.run_attempt }}")
    assert '/actions/runs/$RUN/attempts/$ATTEMPT/jobs"' in jobs["run"] and "|| {" in jobs["run"]
    # The secret only in the environment of the steps that open the store.
    snap, save, publish = steps[6:]
    assert [s for s in steps if "secrets." in json.dumps(s)] == [record, snap]
    for step in (record, snap):
        assert step["env"] == {"SLIME_CI_HISTORY_URL": "${{ secrets.SLIME_CI_HISTORY_URL }}"}
    # After a trusted run only, the trusted runs go where every GPU job restores them from.
    assert record["id"] == "ingest" and snap["if"] == save["if"] == "steps.ingest.outputs.trusted != '0'"
    assert snap["run"] == "nox -s history -- snapshot .ci-cache/history.sqlite"
    assert save["uses"].startswith("actions/cache/save@")
    assert save["with"]["path"] == ".ci-cache/history.sqlite"
    restores = {json.dumps(s["with"]) for p in (WORKFLOW_PATH, RUN_FILE_PATH)
                for j in yaml.safe_load(files[p])["jobs"].values() for s in j["steps"]
                if s.get("name") == "Restore the trusted history (the ingest job's snapshot)"}
    (restore,) = [json.loads(r) for r in restores]
    assert save["with"]["key"].startswith(restore["restore-keys"]) and restore["path"] == save["with"]["path"]
    # And the same file, as the artifact `python -m ci history pull` takes (after a trusted run only).
    assert publish["uses"].startswith("actions/upload-artifact@") and publish["if"] == snap["if"]
    assert publish["with"] == {"name": "slime-ci-history-trusted", "path": ".ci-cache/history.sqlite",
                               "retention-days": 30, "if-no-files-found": "error"}


def test_cpu_jobs_alone_get_the_ingest_workflow_and_no_one_file_watch_without_comments() -> None:
    cpu = tuple(s for s in SUITES if s.tier == "cpu")
    bare = Style(schedules={})
    # A CPU-only repository's suite jobs export their runs too: the ingest workflow records them.
    cpu_only = render(table(cpu, bare, sessions=()), bare)
    assert yaml.safe_load(cpu_only[INGEST_PATH])["on"]["workflow_run"]["workflows"][0] == bare.title
    assert "--export .ci-cache/history-export" in cpu_only[WORKFLOW_PATH]
    quiet = Style(comment_commands=False)
    ingest = yaml.safe_load(render(table(), quiet)[INGEST_PATH])
    assert ingest["on"]["workflow_run"]["workflows"] == [quiet.title, f"{quiet.title} bisect"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
