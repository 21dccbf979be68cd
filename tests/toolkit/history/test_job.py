"""The history steps of a CI job: `history record` (its last step) and `history merge` (a
sharded job's caches), through real `python -m ci` runs on real SQLite files.
"""

import json
import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import PASSING, run_ci, write

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",)),
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", entries=(
            Entry(path="tests/test_ok.py", cpu_only=True),)),
    )
"""
# A CI job's environment, without GitHub's own variables leaking in from whoever runs this.
JOB_ENV = {"GITHUB_SHA": "c0ffee", "GITHUB_REF_NAME": "main", "GITHUB_EVENT_NAME": "push",
           "SLIME_CI_HISTORY_URL": ""}


def _repo(tmp_path: Path) -> Path:
    return write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY, "tests/test_ok.py": PASSING})


def _runs(db: Path) -> list[tuple[str, int, str, int]]:
    """(suite, exit code, backend, attempts) of every run in the store, oldest first."""
    with sqlite3.connect(db) as conn:
        return list(conn.execute(
            "SELECT suite, exit_code, backend, (SELECT count(*) FROM attempts a WHERE a.run_id = r.id) "
            "FROM runs r ORDER BY r.id"))


def _record(root: Path, *args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return run_ci("history", "record", "--root", str(root), *args, env={**JOB_ENV, **(env or {})})


def test_a_job_whose_session_recorded_nothing_is_recorded_anyway(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    db = root / ".ci-cache/history.sqlite"
    failed = _record(root, "--suite", "train", "--status", "failure")
    assert failed.returncode == 0, failed.stderr
    cancelled = _record(root, "--suite", "unit", "--status", "cancelled")
    assert cancelled.returncode == 0, cancelled.stderr
    assert _runs(db) == [("train", 1, "workflow (the session recorded nothing)", 0),
                         ("unit", 130, "workflow (the session recorded nothing)", 0)]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT commit_, branch, event, hardware FROM (SELECT \"commit\" AS commit_,"
                            " branch, event, hardware FROM runs) LIMIT 1").fetchone() == \
            ("c0ffee", "main", "push", "cuda")  # a GPU suite's job, on a CUDA runner
    # A job that passed and recorded nothing adds no invented run.
    passed = _record(root, "--suite", "unit", "--status", "success")
    assert passed.returncode == 0 and "recorded no run" in passed.stdout
    assert len(_runs(db)) == 2


def test_a_session_that_recorded_its_run_is_not_recorded_twice(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    db = root / ".ci-cache/history.sqlite"
    run = run_ci("run", "--suite", "unit", "--root", str(root), "--no-prefork", env=JOB_ENV)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (root / ".ci-cache/history-journal").is_file()
    step = _record(root, "--suite", "unit", "--status", "failure")  # a later step failed
    assert step.returncode == 0, step.stderr
    assert "this job recorded 1 run(s): unit" in step.stdout
    assert [r[:2] for r in _runs(db)] == [("unit", 0)]
    assert not (root / ".ci-cache/history-journal").exists()  # consumed


def test_spooled_runs_are_written_and_an_unreachable_store_never_fails_the_step(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    down = {"SLIME_CI_HISTORY_URL": "postgresql://ci@127.0.0.1:9/none"}  # port 9: nothing listens
    run = run_ci("run", "--suite", "unit", "--root", str(root), "--no-prefork", env={**JOB_ENV, **down})
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(list((root / ".ci-cache/history-pending").glob("*.json"))) == 1
    still_down = _record(root, "--suite", "unit", "--status", "success", env=down)
    assert still_down.returncode == 0
    assert "spooled runs stay spooled" in still_down.stderr and len(still_down.stderr.splitlines()) == 1
    # The shared store is back (here: a SQLite file): the record step writes what was spooled.
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    back = _record(root, "--suite", "unit", "--status", "success", "--history", url)
    assert back.returncode == 0, back.stderr
    assert "wrote 1 spooled run(s)" in back.stdout
    assert [r[:2] for r in _runs(tmp_path / "shared.sqlite")] == [("unit", 0)]
    assert not list((root / ".ci-cache/history-pending").glob("*.json"))


def test_bad_status_is_one_line_exit_2(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    bad = _record(root, "--suite", "unit", "--status", "skipped")
    assert bad.returncode == 2
    assert "expected one of success, failure, cancelled" in bad.stderr
    assert "Traceback" not in bad.stderr and not (root / ".ci-cache/history.sqlite").exists()


def test_merge_keeps_every_shard_history_once_and_the_longest_duration(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    shards = root / ".ci-cache/shards"
    # Two shards' caches as main's last run left them: each ran, then kept its copy.
    for shard, seconds in ((1, 3.0), (2, 5.0)):
        run = run_ci("run", "--suite", "unit", "--root", str(root), "--no-prefork", env=JOB_ENV)
        assert run.returncode == 0, run.stdout + run.stderr
        (root / ".ci-cache/durations.json").write_text(json.dumps({"tests/test_ok.py": seconds}))
        kept = _record(root, "--suite", "unit", "--status", "success", "--keep-in", str(shards / str(shard)))
        assert kept.returncode == 0, kept.stderr
    assert len(_runs(shards / "1/history.sqlite")) == 1 and len(_runs(shards / "2/history.sqlite")) == 2
    # A fresh runner: nothing of its own; it merges both caches.
    (root / ".ci-cache/history.sqlite").unlink()
    (root / ".ci-cache/durations.json").unlink()
    merged = run_ci("history", "merge", str(shards), "--root", str(root), env=JOB_ENV)
    assert merged.returncode == 0, merged.stderr
    assert "merged 2 shard store(s) (2 new run(s))" in merged.stdout  # shard 2 had shard 1's run too
    assert len(_runs(root / ".ci-cache/history.sqlite")) == 2
    assert json.loads((root / ".ci-cache/durations.json").read_text()) == {"tests/test_ok.py": 5.0}
    again = run_ci("history", "merge", str(shards), "--root", str(root), env=JOB_ENV)
    assert "(0 new run(s))" in again.stdout and len(_runs(root / ".ci-cache/history.sqlite")) == 2


def test_merge_of_nothing_and_of_a_corrupt_shard_file(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    none = run_ci("history", "merge", ".ci-cache/shards", "--root", str(root), env=JOB_ENV)
    assert none.returncode == 0 and "merged 0 shard store(s)" in none.stdout
    bad = root / ".ci-cache/shards/1/history.sqlite"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not a database" * 100)
    merged = run_ci("history", "merge", ".ci-cache/shards", "--root", str(root), env=JOB_ENV)
    assert merged.returncode == 0
    assert "left out of the merge" in merged.stderr and len(merged.stderr.splitlines()) == 1


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
