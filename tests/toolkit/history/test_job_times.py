"""The jobs' wall times of finished workflow runs: parsed from GitHub's job objects, recorded by
`history ingest --jobs` with the event's word on event, PR and trust, in a real SQLite file and
a real PostgreSQL server, and read back by `history waits` as each run's slowest hosted job.

The job objects are written here in the shape GitHub's API gives them (`name`, `started_at`,
`completed_at`, `conclusion`, `labels`), as the ingest job's `gh api … --jq` keeps them: this
machine has no GitHub. The workflow step that fetches them runs under act in
tests/toolkit/actions (the GitHub stand-in serves the run's jobs).
"""

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci

from ci.history.job_times import JQ, job_times, parse_jobs, quantile, record_job_times, summary, waits
from ci.history.store import open_store

NUM_GPUS = 0

SHA = "c0ffee" * 6 + "c0ff"


def job(name, start, end, *, conclusion="success", labels=("ubuntu-latest",)):
    return {"name": name, "started_at": start, "completed_at": end, "conclusion": conclusion,
            "labels": list(labels)}


JOBS = [
    job("cpu_unit", "2026-12-01T10:00:05Z", "2026-12-01T10:02:35Z"),
    job("toolkit (shard 1/3)", "2026-12-01T10:00:07Z", "2026-12-01T10:06:07Z"),  # 6 min: the slowest
    job("toolkit (shard 2/3)", "2026-12-01T10:00:09Z", "2026-12-01T10:05:39Z", conclusion="failure"),
    job("megatron", "2026-12-01T10:00:10Z", "2026-12-01T10:40:10Z", labels=("self-hosted", "gpu")),
    job("ckpt", None, None, conclusion="skipped"),  # never ran: left out
]


def lines(jobs):
    return "".join(json.dumps(j) + "\n" for j in jobs)


def parsed(jobs, **over):
    trigger = {"run_id": "777", "attempt": 1, "event": "pull_request", "commit": SHA, "pr": 12, "trusted": False}
    return parse_jobs(lines(jobs), **{**trigger, **over})


def test_jobs_are_parsed_with_their_runner_kind_and_skipped_ones_left_out():
    rows = parsed(JOBS)
    assert [r.job for r in rows] == ["cpu_unit", "toolkit (shard 1/3)", "toolkit (shard 2/3)", "megatron"]
    by = {r.job: r for r in rows}
    assert by["cpu_unit"].seconds == 150 and by["toolkit (shard 2/3)"].conclusion == "failure"
    assert by["megatron"].hosted is False and all(by[n].hosted for n in ("cpu_unit", "toolkit (shard 1/3)"))
    [wait] = waits(rows)
    # The self-hosted GPU job ran 40 minutes, but what the author waited for on hosted runners
    # is the slowest hosted job.
    assert (wait.slowest, wait.seconds, wait.jobs, wait.pr) == ("toolkit (shard 1/3)", 360, 3, 12)
    assert waits(rows, event="push") == []


@pytest.mark.parametrize(("text", "message"), [
    ("{not json\n", "line 1: not JSON"),
    ("[1]\n", "line 1: not a JSON object"),
    (lines([job("", "2026-12-01T10:00:00Z", "2026-12-01T10:01:00Z")]), "`name` is not a job name"),
    (lines([job("a", "yesterday", "2026-12-01T10:01:00Z")]), "`started_at`: not an ISO 8601 time"),
    (lines([job("a", "2026-12-01T10:02:00Z", "2026-12-01T10:01:00Z")]), "ends before it starts"),
    (lines([{**job("a", "2026-12-01T10:00:00Z", "2026-12-01T10:01:00Z"), "labels": "x"}]), "`labels`"),
    (lines([job("a", "2026-12-01T10:00:00Z", "2026-12-01T10:01:00Z")] * 2), "listed twice"),
])
def test_a_bad_job_object_is_an_error_naming_its_line(text, message):
    with pytest.raises(ValueError, match=message):
        parse_jobs(text, run_id="1", attempt=1, event="push", commit="", pr=None, trusted=True)


def test_quantile_is_a_value_seen_and_the_summary_names_the_usual_slowest():
    assert quantile([], 0.9) == 0.0 and quantile([5.0], 0.9) == 5.0
    assert quantile([float(x) for x in range(1, 11)], 0.9) == 9.0
    rows = parsed(JOBS) + parsed(JOBS, run_id="778")
    assert summary(waits(rows), last=30) == ("wait of the last 2 pull_request run(s): median 6.0 min, p90 6.0 min, "
                                            "worst 6.0 min; slowest most often: toolkit (shard 1/3)")
    assert "no run recorded" in summary([], last=30)


def test_the_fetch_keeps_one_compact_object_a_line():
    assert JQ.startswith(".jobs[] | {name, started_at, completed_at, conclusion, labels}") and JQ.endswith("tojson")


def _event(tmp_path, *, event="pull_request", prs=(12,), attempt=2):
    path = tmp_path / "event.json"
    path.write_text(json.dumps({
        "workflow_run": {"id": 777, "run_attempt": attempt, "path": ".github/workflows/pr-test.yml",
                         "event": event, "head_branch": "feature", "head_sha": SHA,
                         "head_repository": {"full_name": "o/r"}, "pull_requests": [{"number": n} for n in prs],
                         "display_title": "Add a thing"},
        "repository": {"full_name": "o/r", "default_branch": "main"}}))
    return path


def _ingest(tmp_path, url, jobs_file, *extra):
    env = {k: "" for k in os.environ if k.startswith("GITHUB_")}
    env.update(GITHUB_OUTPUT=str(tmp_path / "outputs"), SLIME_CI_HISTORY_URL="")
    (tmp_path / "artifacts").mkdir(exist_ok=True)  # a PR's CPU-only run exports no record
    return run_ci("history", "ingest", str(tmp_path / "artifacts"), "--event-file", str(_event(tmp_path)),
                  "--history", url, "--root", str(tmp_path), "--jobs", str(jobs_file), *extra, env=env)


def test_ingest_records_the_jobs_with_the_events_word_once_and_waits_reads_them(tmp_path, store_url):
    jobs_file = tmp_path / "jobs.jsonl"
    # The file claims nothing about trust or PR: those come from the event.
    jobs_file.write_text(lines(JOBS))
    done = _ingest(tmp_path, store_url, jobs_file)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 job time(s), 4 new" in done.stdout and "no exported run" in done.stdout
    again = _ingest(tmp_path, store_url, jobs_file)  # a rerun of the ingest job
    assert again.returncode == 0 and "4 job time(s), 0 new" in again.stdout
    with open_store(store_url) as store:
        rows = job_times(store, event="pull_request")
    assert len(rows) == 4 and {(r.gh_run_id, r.gh_run_attempt, r.pr, r.trusted, r.commit) for r in rows} == {
        ("777", 2, 12, False, SHA)}
    shown = run_ci("history", "waits", "--history", store_url, "--root", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert "6.0 min  toolkit (shard 1/3) (slowest of 3 hosted jobs)" in shown.stdout
    assert "PR #12" in shown.stdout and "wait of the last 1 pull_request run(s)" in shown.stdout
    as_json = json.loads(run_ci("history", "waits", "--history", store_url, "--root", str(tmp_path),
                                "--json").stdout)
    assert [(w["slowest"], w["seconds"]) for w in as_json] == [("toolkit (shard 1/3)", 360.0)]
    # The monitor's report says it too, beside what main broke.
    report = tmp_path / "monitor.md"
    monitor = run_ci("history", "monitor", "--history", store_url, "--root", str(tmp_path), "--out", str(report))
    assert monitor.returncode == 0, monitor.stderr
    assert "Pull requests' wait of the last 1 pull_request run(s): median 6.0 min" in report.read_text()


def test_a_version_7_store_gains_the_table_and_keeps_its_runs(store_url):
    from sqlalchemy import inspect, text

    from ci.history import schema
    from ci.history.rows import RunRecord
    from ci.history.schema import LATEST

    with open_store(store_url) as store:
        store.record(RunRecord(uid="07" * 16, suite="unit", started_at=1e9, ended_at=1e9 + 1, exit_code=0))
        with store.engine.begin() as conn:
            conn.execute(text("DROP TABLE job_times"))
            conn.execute(schema.meta.update().values(value="7"))
    with open_store(store_url) as store:
        assert store.version == LATEST == 9
        assert "job_times" in inspect(store.engine).get_table_names()
        assert [r.uid for r in store.runs()] == ["07" * 16]
        assert record_job_times(store, parsed(JOBS)) == 4 and len(job_times(store)) == 4


def test_a_missing_or_bad_jobs_file(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    missing = _ingest(tmp_path, url, tmp_path / "nope.jsonl")
    assert missing.returncode == 0 and "no jobs' times at" in missing.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    refused = _ingest(tmp_path, url, bad)
    assert refused.returncode == 2 and "line 1: not JSON; no job time recorded" in refused.stderr
    dry = tmp_path / "jobs.jsonl"
    dry.write_text(lines(JOBS))
    said = _ingest(tmp_path, url, dry, "--dry-run")
    assert said.returncode == 0 and "4 job time(s) would be recorded" in said.stdout
    with_pr = run_ci("history", "ingest", str(tmp_path / "artifacts"), "--pr", "3", "--history", url,
                     "--root", str(tmp_path), "--jobs", str(dry))
    assert with_pr.returncode == 2 and "--jobs goes with --event-file" in with_pr.stderr


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
