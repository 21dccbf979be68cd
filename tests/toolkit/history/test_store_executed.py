"""What each entry executed, in the history (schema 7; its lines, schema 9): written with its run, exported and
ingested the way runs go, read back as the newest trusted record per entry, and what
`python -m ci plan` selects from it.

Real SQLite files and the real PostgreSQL server (`store_url`); the records here are written
by hand where a test is about the store, and by a real recording run in
tests/toolkit/run/test_record_executed.py, which checks that the run puts them here.
"""

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, run_ci

from ci.history.ingest import Trigger, collect, export, ingest, parse_record
from ci.history.record import executed_records
from ci.history.rows import MAX_EXECUTED_FILES, AttemptRecord, ExecutedRecord, RunRecord
from ci.history.schema import LATEST
from ci.history.store import RecordRefused, open_store
from ci.select import executed

NUM_GPUS = 0
NOW = time.time()
CK = "slime/backends/fsdp/checkpoint.py"
LOADS = {CK: ("<module>", "Checkpointer.save", "load"), "tests/e2e/test_loads.py": ("execute",)}
RANKS = {CK: ("<module>", "latest_step"), "tests/e2e/_rank.py": ("<module>", "only_in_rank")}
LINES = {CK: ("c" * 40, "1-12,20,31-33")}  # schema 9: the lines each ran, and the blob they number


def _run(uid: str, *, started: float, commit: str = "a" * 40, trusted: bool = True,
         ran: dict[str, dict[str, tuple[str, ...]]] | None = None) -> RunRecord:
    ran = ran if ran is not None else {"tests/e2e/test_loads.py": LOADS}
    attempts = tuple(AttemptRecord(entry_id=e, path=e, attempt=1, final=True, outcome="passed", passed=1,
                                   seconds=3.0) for e in ran)
    return RunRecord(uid=uid, suite="train", commit=commit, branch="main", event="schedule",
                     hardware="emulated", started_at=started, ended_at=started + 5, exit_code=0,
                     trusted=trusted, attempts=attempts,
                     executed=tuple(ExecutedRecord(entry_id=e, files=f, lines=LINES) for e, f in ran.items()))


def test_a_run_keeps_what_its_entries_executed_and_reads_it_back_whole(store_url):
    run = _run("r1" * 16, started=NOW - 60, ran={"tests/e2e/test_loads.py": LOADS,
                                                  "tests/e2e/test_ranks.py": RANKS})
    with open_store(store_url) as store:
        assert store.record(run)
        back = {r.uid: r for r in store.runs()}[run.uid]
        newest = store.executed()
    assert back == run, "the export and the snapshot copy runs through runs(): it must be whole"
    assert {e: r.files for e, r in newest.items()} == {"tests/e2e/test_loads.py": LOADS,
                                                       "tests/e2e/test_ranks.py": RANKS}
    assert newest["tests/e2e/test_ranks.py"].commit == "a" * 40
    assert newest["tests/e2e/test_ranks.py"].lines == LINES


def test_a_version_8_store_gains_the_lines_and_its_records_read_by_functions(store_url):
    from sqlalchemy import inspect, text

    from ci.history import schema

    with open_store(store_url) as store:
        store.record(_run("05" * 16, started=NOW - 50))
        with store.engine.begin() as conn:
            conn.execute(text("ALTER TABLE executed DROP COLUMN lines"))
            conn.execute(schema.meta.update().values(value="8"))
    with open_store(store_url) as store:
        assert store.version == LATEST
        assert "lines" in {c["name"] for c in inspect(store.engine).get_columns("executed")}
        old = store.executed()["tests/e2e/test_loads.py"]
        assert (old.files, old.lines) == (LOADS, {})


def test_the_newest_trusted_record_per_entry_is_read_and_a_pull_requests_never(store_url):
    older = _run("01" * 16, started=NOW - 300, commit="1" * 40,
                 ran={"tests/e2e/test_loads.py": {CK: ("load",)}})
    newer = _run("02" * 16, started=NOW - 200, commit="2" * 40)
    from_pr = _run("03" * 16, started=NOW - 100, commit="3" * 40, trusted=False,
                   ran={"tests/e2e/test_loads.py": {"slime/x.py": ("<module>",)}})
    with open_store(store_url) as store:
        for run in (newer, from_pr, older):  # written out of order: the run's start decides
            store.record(run)
        trusted = store.executed()
        every = store.executed(trusted_only=False)
    assert (trusted["tests/e2e/test_loads.py"].commit, trusted["tests/e2e/test_loads.py"].files) == \
        ("2" * 40, LOADS)
    assert every["tests/e2e/test_loads.py"].commit == "3" * 40


def test_a_version_6_store_gains_the_table_and_keeps_its_runs(store_url):
    from sqlalchemy import inspect, text

    from ci.history import schema

    with open_store(store_url) as store:
        store.record(replace(_run("06" * 16, started=NOW - 50), executed=()))
        with store.engine.begin() as conn:
            conn.execute(text("DROP TABLE executed"))
            conn.execute(schema.meta.update().values(value="6"))
        assert "executed" not in inspect(store.engine).get_table_names()
    with open_store(store_url) as store:
        assert store.version == LATEST
        assert "executed" in inspect(store.engine).get_table_names()
        assert [r.uid for r in store.runs()] == ["06" * 16] and store.executed() == {}
        assert store.record(_run("07" * 16, started=NOW - 40))
        assert set(store.executed()) == {"tests/e2e/test_loads.py"}


def test_records_past_the_bounds_are_refused_before_anything_is_written(store_url):
    huge = {f"slime/f{i}.py": ("<module>",) for i in range(MAX_EXECUTED_FILES + 1)}
    twice = _run("08" * 16, started=NOW - 30)
    twice = replace(twice, executed=twice.executed * 2)
    with open_store(store_url) as store:
        with pytest.raises(RecordRefused, match="more than 20000 files"):
            store.record(_run("09" * 16, started=NOW - 30, ran={"tests/e2e/test_loads.py": huge}))
        with pytest.raises(RecordRefused, match="listed twice"):
            store.record(twice)
        assert store.counts()["runs"] == 0


def _through_the_artifact(tmp_path: Path, run: RunRecord, trigger: Trigger, into: str) -> dict:
    """Export the run as a job does, ingest the folder as the trusted job does; what `into` reads."""
    job = f"sqlite:///{tmp_path / 'job.sqlite'}"
    with open_store(job) as store:
        store.record(run)
        assert export(store, [run.uid], tmp_path / "artifact", warn=pytest.fail) == 1
    runs = collect(tmp_path / "artifact", trigger=trigger, now=time.time())
    with open_store(into) as store:
        assert ingest(store, runs) == 1
        return store.executed()


def test_a_trusted_nightlys_records_come_through_export_and_ingest(tmp_path, store_url):
    run = _run("0a" * 16, started=NOW - 20, commit="b" * 40)
    nightly = Trigger(run_id=778, workflow=".github/workflows/pr-test.yml", event="schedule",
                      trusted=True, pr=None, head_sha="b" * 40)
    got = _through_the_artifact(tmp_path, run, nightly, store_url)
    assert {e: (r.files, r.lines) for e, r in got.items()} == {"tests/e2e/test_loads.py": (LOADS, LINES)}


def test_a_pull_requests_records_are_ingested_untrusted_and_never_selected_from(tmp_path, store_url):
    run = _run("0b" * 16, started=NOW - 20)
    pr = Trigger(run_id=779, workflow=".github/workflows/pr-test.yml", event="pull_request",
                 trusted=False, pr=12)
    assert _through_the_artifact(tmp_path, run, pr, store_url) == {}
    with open_store(store_url) as store:
        assert set(store.executed(trusted_only=False)) == {"tests/e2e/test_loads.py"}


PR12 = Trigger(run_id=777, workflow=".github/workflows/pr-test.yml", event="pull_request",
               trusted=False, pr=12)


@pytest.mark.parametrize(("executed_field", "why"), [
    ([{"entry_id": "e", "files": {"a.py": ["f"]}, "extra": 1}], "object of `entry_id`, `files` and"),
    ([{"entry_id": "e", "files": {}, "lines": {"a.py": ["f" * 40, "1-x"]}}], "line spans like"),
    ([{"entry_id": "e", "files": {}, "lines": {"a.py": ["nohex", "1-3"]}}], "a git blob id"),
    ([{"entry_id": "e", "files": {}, "lines": {"a.py": "1-3"}}], "a git blob id"),
    ([{"entry_id": "e", "files": {"a.py": "f"}}], "list of function names"),
    ([{"entry_id": "e", "files": {"a.py": ["f\u0000"]}}], "list of function names"),
    ([{"entry_id": "e", "files": {}}, {"entry_id": "e", "files": {}}], "or repeats"),
    ([{"entry_id": "e", "files": ["a.py"]}], "is not an object of at most"),
    ("everything", "`executed` is not a valid list"),
])
def test_the_ingest_refuses_a_malformed_record_of_executed_code(executed_field, why):
    data = json.loads(replace(_run("0c" * 16, started=NOW - 10), trusted=False).to_json())
    data["executed"] = executed_field
    with pytest.raises(ValueError, match=why):
        parse_record(json.dumps(data), trigger=PR12, now=time.time())


def test_an_export_of_an_older_toolkit_without_the_field_is_taken(tmp_path):
    data = json.loads(replace(_run("0d" * 16, started=NOW - 10), trusted=False).to_json())
    del data["executed"]
    assert parse_record(json.dumps(data), trigger=PR12, now=time.time()).executed == ()


def test_selection_reads_the_store_first_and_the_records_file_for_the_rest(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    with open_store(url) as store:
        store.record(_run("0e" * 16, started=NOW - 10, commit="e" * 40))
    executed.save(tmp_path / executed.RECORDS_FILE, [
        executed.Record(entry="tests/e2e/test_loads.py", commit="f" * 40, recorded_at=NOW, files={}),
        executed.Record(entry="tests/e2e/test_ranks.py", commit="f" * 40, recorded_at=NOW, files=RANKS)])
    got = executed_records(url, tmp_path, warn=pytest.fail)
    assert (got["tests/e2e/test_loads.py"].commit, got["tests/e2e/test_loads.py"].files) == ("e" * 40, LOADS)
    assert (got["tests/e2e/test_loads.py"].lines, got["tests/e2e/test_loads.py"].blobs) == \
        ({CK: "1-12,20,31-33"}, {CK: "c" * 40})
    assert got["tests/e2e/test_ranks.py"].commit == "f" * 40
    missing = f"sqlite:///{tmp_path / 'none.sqlite'}"
    assert set(executed_records(missing, tmp_path, warn=pytest.fail)) == set(got)
    assert not (tmp_path / "none.sqlite").exists(), "reading must not leave an empty store behind"


# The entries of this repository's megatron and ckpt suites, as a nightly would record them.
# Hand-written rows: what a real recording run writes is tests/toolkit/run/test_record_executed.py's.
def _real_entries() -> dict[str, list[str]]:
    proc = run_ci("plan", "--event", "pull_request", "--labels", "run-ci-megatron,run-ci-ckpt",
                  "--paths", "slime/rollout/filter.py", "--json", "--root", str(REPO))
    assert proc.returncode == 0, proc.stderr
    return {j["job"]: [e["entry"] for e in j["entries"]] for j in json.loads(proc.stdout) if "entries" in j}


def test_plan_selects_from_the_store_the_entries_that_executed_the_file(tmp_path):
    jobs = _real_entries()
    assert {"megatron", "ckpt"} <= set(jobs) and all(jobs.values()), jobs
    loader = jobs["ckpt"][0]
    others = [e for j in ("megatron", "ckpt") for e in jobs[j] if e != loader]
    ran = {loader: {CK: ("load",)}, **{e: {"slime/utils/misc.py": ("<module>",)} for e in others[:-1]}}
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    with open_store(url) as store:
        store.record(_run("0f" * 16, started=NOW - 10, ran=ran))
    proc = run_ci("plan", "--event", "pull_request", "--labels", "run-ci-megatron,run-ci-ckpt",
                  "--paths", CK, "--json", "--history", url, "--root", str(REPO))
    assert proc.returncode == 0, proc.stderr
    picked = {e["entry"]: (e["runs"], e["reason"]) for j in json.loads(proc.stdout) if "entries" in j
              for e in j["entries"]}
    assert picked[loader] == (True, f"executes {CK} (module level changed)")
    assert picked[others[-1]] == (True, "no record")
    assert all(picked[e] == (False, "executes none of the changed code") for e in others[:-1])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
