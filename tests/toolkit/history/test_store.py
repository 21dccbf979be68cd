"""The run-history store on SQLite and on a real PostgreSQL server: writes, reads, concurrency, bad stores."""

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, run_ci

from ci.errors import StoreError, UsageError
from ci.history.rows import AttemptRecord, MetricPoint, RunRecord, parse_metrics
from ci.history.schema import LATEST
from ci.history.store import normalise, open_store, resolve_url

NUM_GPUS = 0




def _run(uid, *, entries=2, steps=3, started=0.0, outcome="passed", suite="s"):
    attempts = tuple(AttemptRecord(entry_id=f"tests/test_{i}.py", path=f"tests/test_{i}.py", attempt=1,
                                   final=True, outcome=outcome, passed=1, seconds=1.0 + i)
                     for i in range(entries))
    metrics = tuple(MetricPoint(entry_id="tests/test_0.py", step=s, name="reward", value=s / 10)
                    for s in range(steps))
    return RunRecord(uid=uid, suite=suite, commit="c" * 40, branch="main", hardware="emulated",
                     started_at=started, ended_at=started + 1, exit_code=0, attempts=attempts,
                     metrics=metrics)


def test_a_run_reads_back_as_written(store_url):
    with open_store(store_url) as store:
        assert store.record(_run("r1", started=10))
        assert not store.record(_run("r1", started=10)), "the same run twice must be one run"
        assert store.counts() == {"runs": 1, "attempts": 2, "metrics": 3}
        rows = store.attempts(hardware="emulated")
        assert [(r.entry_id, r.seconds, r.final) for r in rows] == [
            ("tests/test_0.py", 1.0, True), ("tests/test_1.py", 2.0, True)]
        assert store.attempts(hardware="cuda") == []
        series = store.metric_series("tests/test_0.py", hardware="emulated", names=["reward"])
        assert [(m.step, m.value) for m in series] == [(0, 0.0), (1, 0.1), (2, 0.2)]
        assert store.metric_series("tests/test_0.py", hardware="cuda", names=["reward"]) == []


WRITER = """
import sys, time, pathlib
from ci.history.rows import AttemptRecord, MetricPoint, RunRecord
from ci.history.store import open_store
url, me, runs, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), pathlib.Path(sys.argv[4])
while not go.exists():
    time.sleep(0.01)
store = open_store(url)   # every writer migrates the fresh store at the same moment
for n in ["shared"] + [f"w{me}-{i}" for i in range(runs)]:
    attempts = tuple(AttemptRecord(entry_id=f"e{j}", path=f"e{j}", attempt=1, final=True,
                                   outcome="passed", seconds=float(j)) for j in range(3))
    metrics = tuple(MetricPoint(entry_id="e0", step=s, name="m", value=float(s)) for s in range(4))
    store.record(RunRecord(uid=n, suite="s", started_at=time.time(), ended_at=time.time(),
                           exit_code=0, attempts=attempts, metrics=metrics))
store.close()
"""


def test_concurrent_writers_lose_and_duplicate_nothing(store_url, tmp_path):
    writers, runs = 6, 8
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, store_url, str(w), str(runs), str(go)],
                              env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                              stderr=subprocess.PIPE, text=True)
             for w in range(writers)]
    time.sleep(1.0)  # every writer imported SQLAlchemy and waits at the start line
    go.touch()
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * writers, errors
    expected_runs = writers * runs + 1  # each writer's runs, and the one run they all record
    with open_store(store_url) as store:
        assert store.counts() == {"runs": expected_runs, "attempts": expected_runs * 3,
                                  "metrics": expected_runs * 4}
        uids = {r.run_uid for r in store.attempts(last_runs=10_000)}
        assert len(uids) == expected_runs and "shared" in uids


def test_a_newer_schema_is_refused_and_left_alone(store_url):
    with open_store(store_url) as store:
        store.record(_run("keep"))
        from ci.history import schema
        with store.engine.begin() as conn:
            conn.execute(schema.meta.update().values(value="99"))
    with pytest.raises(StoreError, match=rf"schema version 99, newer than this slime-ci knows \({LATEST}\)"):
        open_store(store_url)


def _drop_version_6(conn):
    from sqlalchemy import text

    for table, column in (("attempts", "fail_path"), ("attempts", "fail_line"), ("runs", "gh_run_id"),
                          ("runs", "gh_run_attempt"), ("runs", "gh_job")):
        conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))


def test_a_version_5_store_gains_failure_sites_and_actions_runs_its_old_rows_empty(store_url):
    from sqlalchemy import text

    from ci.history import schema

    with open_store(store_url) as store, store.engine.begin() as conn:
        _drop_version_6(conn)
        conn.execute(schema.meta.update().values(value="5"))
        conn.execute(text("INSERT INTO runs (uid, suite, \"commit\", branch, event, host, runner, backend, "
                          "hardware, started_at, ended_at, exit_code) VALUES ('old', 's', 'c', 'main', "
                          "'push', 'h', 'r', 'local', 'cpu', 1.0, 2.0, 1)"))
        conn.execute(text("INSERT INTO attempts (run_id, entry_id, path, attempt, final, outcome, passed, failed, "
                          "skipped, num_gpus, devices, node, seconds, reason) SELECT id, 'tests/t.py', "
                          "'tests/t.py', 1, TRUE, 'failed', 0, 1, 0, 0, '', '', 1.0, 'AssertionError' FROM runs"))
    failed = AttemptRecord(entry_id="tests/t.py", path="tests/t.py", attempt=1, final=True, outcome="failed",
                           failed=1, seconds=1.0, reason="AssertionError", fail_path="tests/t.py", fail_line=12)
    new = RunRecord(uid="new", suite="s", commit="d" * 40, branch="main", hardware="cpu", started_at=5.0,
                    ended_at=6.0, exit_code=1, gh_run_id="12345678901", gh_run_attempt=2, gh_job="cpu_unit",
                    attempts=(failed,))
    with open_store(store_url) as store:
        assert store.version == LATEST
        assert store.record(new)
        got = {r.run_uid: r for r in store.attempts()}
        runs = {r.uid: r for r in store.runs()}
    assert (got["old"].fail_path, got["old"].fail_line, got["old"].gh_run_id, got["old"].gh_run_attempt) == \
        ("", None, "", None)
    assert (got["new"].fail_path, got["new"].fail_line) == ("tests/t.py", 12)
    assert (got["new"].gh_run_id, got["new"].gh_run_attempt, got["new"].gh_job) == ("12345678901", 2, "cpu_unit")
    assert runs["new"] == new, "what the snapshot and the export copy must come back whole"


def _version_1_store(url):
    """A store as version 1 of the schema left it: `runs` without `trusted` and `pr`, one run."""
    from sqlalchemy import text

    from ci.history import schema

    with open_store(url) as store, store.engine.begin() as conn:
        conn.execute(text("ALTER TABLE runs DROP COLUMN trusted"))
        conn.execute(text("ALTER TABLE runs DROP COLUMN pr"))
        conn.execute(text("DROP TABLE bisects"))  # version 3's
        conn.execute(text("ALTER TABLE attempts DROP COLUMN exit_code"))  # version 4's
        conn.execute(text("DROP TABLE quarantine_lifts"))  # version 5's
        _drop_version_6(conn)
        conn.execute(schema.meta.update().values(value="1"))
        conn.execute(text("INSERT INTO runs (uid, suite, \"commit\", branch, event, host, runner, backend, "
                          "hardware, started_at, ended_at, exit_code) VALUES ('old', 's', 'c', 'main', "
                          "'push', 'h', 'r', 'local', 'emulated', 1.0, 2.0, 0)"))


def test_a_version_1_store_gains_trust_and_its_runs_stay_trusted(store_url):

    _version_1_store(store_url)
    with open_store(store_url) as store:
        assert store.version == LATEST
        from sqlalchemy import inspect
        assert "bisects" in inspect(store.engine).get_table_names()  # version 3: bisect answers
        pr_run = RunRecord(**{**_run("pr-run", started=5).__dict__, "trusted": False, "pr": 17})
        assert store.record(pr_run)
        runs = {r.uid: r for r in store.runs()}
        assert (runs["old"].trusted, runs["old"].pr) == (True, None)
        assert (runs["pr-run"].trusted, runs["pr-run"].pr) == (False, 17)
    with open_store(store_url) as again:  # migrating twice changes nothing
        assert again.version == LATEST and again.counts()["runs"] == 2


def test_runs_of_pull_request_code_are_never_a_baseline(store_url):
    with open_store(store_url) as store:
        store.record(_run("trusted", started=1))
        untrusted = _run("from-a-pr", started=2)
        store.record(RunRecord(**{**untrusted.__dict__, "uid": "from-a-pr", "trusted": False, "pr": 3}))
        every = {r.run_uid for r in store.attempts()}
        baseline = {r.run_uid for r in store.attempts(trusted_only=True)}
        assert every == {"trusted", "from-a-pr"} and baseline == {"trusted"}
        assert {r.pr for r in store.attempts() if not r.trusted} == {3}
        series = store.metric_series("tests/test_0.py", hardware="emulated", names=["reward"])
        assert {m.run_uid for m in series} == {"trusted"}, "a PR's metrics must not move a baseline"


def test_malformed_and_unsupported_urls_are_usage_errors(tmp_path):
    for bad, text in [("postgresql://u@host:notaport/db", "malformed"),
                      ("mysql://u@h/db", "only postgresql:// and sqlite:///"),
                      ("postgresql+asyncpg://u@h/db", "use postgresql://"),
                      ("sqlite://", "needs a file"),
                      ("::nonsense::", "malformed")]:
        with pytest.raises(UsageError, match=text):
            normalise(bad)
    assert resolve_url("off", {}, tmp_path) is None
    assert resolve_url(None, {"SLIME_CI_HISTORY_URL": "postgresql://u@h/db"}, tmp_path) == \
        "postgresql+psycopg://u@h/db"
    assert resolve_url(None, {}, tmp_path) == f"sqlite:///{tmp_path}/.ci-cache/history.sqlite"
    proc = run_ci("history", "show", "--history", "postgresql://u:secret@h:port/db", "--root", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "malformed" in proc.stderr and "secret" not in proc.stderr


def test_a_corrupt_sqlite_file_is_one_line_exit_4_and_untouched(tmp_path):
    bad = tmp_path / "history.sqlite"
    bad.write_bytes(b"this is not a database, it is a cache accident\n" * 100)
    before = bad.read_bytes()
    proc = run_ci("history", "show", "--history", f"sqlite:///{bad}", "--root", str(tmp_path))
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.count("\n") == 1 and "is not a SQLite database (corrupt?)" in proc.stderr
    assert bad.read_bytes() == before


def test_metrics_jsonl_keeps_numeric_scalars_per_step():
    text = "\n".join([json.dumps({"step": 0, "rollout/reward": 0.5, "engines": [1], "ok": True}),
                      json.dumps({"step": 1, "rollout/reward": 0.75, "train/kl": 1e-3}),
                      '{"step": 2, "rollout/rew'])  # the last line cut short by a kill
    points = parse_metrics("e", text)
    assert sorted((p.step, p.name, p.value) for p in points) == [
        (0, "rollout/reward", 0.5), (1, "rollout/reward", 0.75), (1, "train/kl", 1e-3)]


def test_sqlite_file_is_a_real_sqlite_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    with open_store(url) as store:
        store.record(_run("x"))
    with sqlite3.connect(tmp_path / "h.sqlite") as conn:
        assert conn.execute("select value from slime_ci_meta").fetchone() == (str(LATEST),)
        assert conn.execute("select count(*) from attempts").fetchone() == (2,)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))


def test_attempts_keep_their_exit_status_and_read_by_pr_or_run(store_url):
    """Schema 3: an attempt's own exit status (a signal) reads back; one PR's runs, one run's."""
    with open_store(store_url) as store:
        killed = AttemptRecord(entry_id="tests/test_k.py", path="tests/test_k.py", attempt=1, final=True,
                               outcome="failed", exit_code=-9, node="gpu-3", reason="exit code -9")
        store.record(RunRecord(**{**_run("pr-a", started=1).__dict__, "trusted": False, "pr": 7,
                                  "attempts": (killed,)}))
        store.record(_run("main-b", started=2))
        rows = store.attempts(pr=7)
        assert [(r.run_uid, r.exit_code, r.node) for r in rows] == [("pr-a", -9, "gpu-3")]
        assert {r.run_uid for r in store.attempts(run_uid="main")} == {"main-b"}
        assert store.attempts(run_uid="%") == [], "a uid prefix is matched literally"
        assert {r.exit_code for r in store.attempts(run_uid="main-b")} == {None}
