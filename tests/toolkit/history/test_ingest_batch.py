"""The ingest is all or nothing: what it accepts every store column holds, the batch is written in
one transaction, a corrupt archive is one line, and the GPU jobs' snapshot reads trusted rows only.

Real `python -m ci history ingest` processes and in-process stores on SQLite and PostgreSQL;
Hypothesis draws records around every bound of the schema.
"""

import io
import json
import os
import sys
import time
import tracemalloc
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci

from ci.errors import UsageError
from ci.history.ingest import Trigger, collect, ingest, snapshot
from ci.history.rows import RunRecord
from ci.history.store import open_store
from ci.results import MetricPoint

NUM_GPUS = 0
PR12 = Trigger(run_id=7, workflow=".github/workflows/pr-test.yml", event="pull_request", trusted=False, pr=12)
NOW = time.time()


def _record(uid: str, **over: Any) -> dict[str, Any]:
    run: dict[str, Any] = {
        "uid": uid, "suite": "train", "commit": "c0ffee", "branch": "feature", "event": "pull_request",
        "host": "h", "runner": "r", "backend": "docker", "hardware": "cuda", "started_at": NOW - 60,
        "ended_at": NOW - 1, "exit_code": 0, "trusted": False, "pr": None,
        "attempts": [_attempt()], "metrics": [_metric()]}
    run.update(over)
    return run


def _attempt(**over: Any) -> dict[str, Any]:
    return {"entry_id": "tests/test_ok.py", "path": "tests/test_ok.py", "attempt": 1, "final": True,
            "outcome": "passed", "passed": 1, "failed": 0, "skipped": 0, "num_gpus": 1, "devices": "0",
            "node": "", "seconds": 3.5, "reason": "", "exit_code": 0, **over}


def _metric(**over: Any) -> dict[str, Any]:
    return {"entry_id": "tests/test_ok.py", "step": 1, "name": "reward", "value": 0.5, **over}


def _ingest(tmp_path: Path, url: str, files: dict[str, bytes]):  # type: ignore[no-untyped-def]
    folder = tmp_path / "downloaded"
    folder.mkdir(exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    event = {"workflow_run": {"id": 7, "path": ".github/workflows/pr-test.yml", "event": "pull_request",
                              "head_branch": "feature", "head_sha": "ab" * 20,
                              "head_repository": {"full_name": "o/r"}, "pull_requests": [{"number": 12}]},
             "repository": {"full_name": "o/r", "default_branch": "main"}}
    (tmp_path / "event.json").write_text(json.dumps(event))
    env = {k: "" for k in os.environ if k.startswith("GITHUB_")} | {"SLIME_CI_HISTORY_URL": ""}
    return run_ci("history", "ingest", str(folder), "--event-file", str(tmp_path / "event.json"),
                  "--history", url, "--root", str(tmp_path), env=env)


def _runs(url: str) -> list[str]:
    with open_store(url) as store:
        return [r.uid for r in store.runs()]


A, B = "a" * 32, "b" * 32


# Each passed the old bounds and was refused by the store halfway through the batch.
REFUSED = [
    ({"attempts": [_attempt(passed=2 ** 31)]}, "attempt 0: `passed` is not a valid int"),
    ({"metrics": [_metric(step=2 ** 40)]}, "metric point 0: `step` is not a valid int"),
    ({"attempts": [_attempt(reason="\ud800 half a character")]},
     "attempt 0: `reason` is not a valid str of at most 500 characters, with no NUL or lone surrogate"),
    ({"attempts": [_attempt(), _attempt(final=False)]}, "attempt 1 of 'tests/test_ok.py' is listed twice"),
    ({"metrics": [_metric(), _metric(value=0.7)]}, "step 1 of 'reward' is listed twice"),
]


# Every case on SQLite; one on PostgreSQL too (the refusal comes before any store is opened).
@pytest.mark.parametrize(("store_url", "bad", "why"),
                         [("sqlite", *case) for case in REFUSED] + [("postgresql", *REFUSED[0])],
                         indirect=["store_url"])
def test_a_batch_the_store_cannot_hold_in_part_writes_nothing(tmp_path: Path, store_url: str,
                                                              bad: dict[str, Any], why: str) -> None:
    done = _ingest(tmp_path, store_url, {"a.json": json.dumps(_record(A)).encode(),
                                         "b.json": json.dumps(_record(B, **bad)).encode()})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and why in done.stderr and "nothing ingested" in done.stderr
    assert not (tmp_path / "history.sqlite").exists()
    assert _runs(store_url) == []  # a.json, valid on its own, is not written either


@pytest.mark.parametrize(("times", "field"), [
    ({"started_at": 1e11, "ended_at": 1e11}, "started_at"),  # the year 5138
    ({"started_at": 1.0}, "started_at"),  # 1970, a clock never set
    ({"ended_at": NOW + 3 * 86_400}, "ended_at"),  # the day after tomorrow
])
def test_times_a_run_cannot_have_are_refused(tmp_path: Path, times: dict[str, float], field: str) -> None:
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    done = _ingest(tmp_path, url, {"a.json": json.dumps(_record(A, **times)).encode()})
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"`{field}` is not a valid time (from 2020 up to tomorrow" in done.stderr
    assert not (tmp_path / "shared.sqlite").exists()


def _corrupt_zip(compression: int) -> bytes:
    name = f"{A}.json"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as archive:
        archive.writestr(name, json.dumps(_record(A)))
    raw = bytearray(buf.getvalue())
    start = 30 + len(name) + (4 if compression == zipfile.ZIP_LZMA else 0)  # past the member's header
    raw[start:start + 8] = b"\xff" * 8
    return bytes(raw)


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_LZMA, zipfile.ZIP_BZIP2])
def test_a_corrupt_compressed_member_is_one_line_and_exit_2(tmp_path: Path, compression: int) -> None:
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    done = _ingest(tmp_path, url, {"4242.zip": _corrupt_zip(compression)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: ingest: 4242.zip is not a readable zip (")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "shared.sqlite").exists()


# --- every bound of the schema, drawn: accepted means stored whole, refused means nothing ---------

_INT32 = 2 ** 31 - 1
# (where, field) -> the bound: the longest text, or the largest integer, each column takes.
TEXTS = {("run", "suite"): 128, ("run", "commit"): 64, ("run", "branch"): 256, ("run", "host"): 256,
         ("run", "hardware"): 64, ("attempt", "path"): 1024, ("attempt", "devices"): 256,
         ("attempt", "node"): 256, ("attempt", "reason"): 500, ("attempt", "outcome"): 32,
         ("metric", "name"): 256}
INTS = {("run", "exit_code"): 1 << 16, ("attempt", "attempt"): 1000, ("attempt", "passed"): _INT32,
        ("attempt", "failed"): _INT32, ("attempt", "num_gpus"): 4096, ("attempt", "exit_code"): _INT32,
        ("metric", "step"): _INT32}
_PLAIN = st.text(st.characters(exclude_characters="\x00"), max_size=6)


def _valid(data: st.DataObject, where: str) -> dict[str, Any]:
    """Values at and inside every bound of `where` (a run, an attempt, a metric point)."""
    out: dict[str, Any] = {}
    for (w, key), limit in TEXTS.items():
        if w == where:
            out[key] = data.draw(st.one_of(_PLAIN, st.just("y" * limit), st.just("\u2028é")))
    for (w, key), bound in INTS.items():
        if w == where:
            out[key] = data.draw(st.one_of(st.integers(0, 3), st.integers(-bound, -bound + 1),
                                           st.integers(bound - 1, bound)))
    return out


def _spoil(data: st.DataObject, run: dict[str, Any]) -> None:
    """One value past a bound: a string too long or not storable, an integer past its column,
    a time no run has, an attempt or a point listed twice."""
    kind = data.draw(st.sampled_from(["text", "int", "time", "twice"]))
    if kind == "twice":
        rows = run["attempts"] if data.draw(st.booleans()) else run["metrics"]
        if rows:
            rows.append(dict(rows[0]))
        return
    if kind == "time":
        run[data.draw(st.sampled_from(["started_at", "ended_at"]))] = data.draw(
            st.sampled_from([1e11, 0.0, 1.5e9, NOW + 3 * 86_400]))
        return
    table = TEXTS if kind == "text" else INTS
    where, key = data.draw(st.sampled_from(sorted(table)))
    bound = table[(where, key)]
    value = (data.draw(st.sampled_from(["\ud800", "a\udfffb", "n\x00", "z" * (bound + 1)])) if kind == "text"
             else data.draw(st.one_of(st.integers(bound + 1, bound + 2), st.integers(-(2 ** 64), -bound - 2))))
    rows = [run] if where == "run" else run["attempts" if where == "attempt" else "metrics"]
    for row in rows[:1]:
        row[key] = value


def _drawn_run(data: st.DataObject, uid: str) -> dict[str, Any]:
    run = {**_valid(data, "run"), "uid": uid, "event": "push", "trusted": False, "runner": "r",
           "backend": "docker", "pr": data.draw(st.sampled_from([None, 12])),
           "started_at": data.draw(st.floats(1.6e9, NOW)), "ended_at": data.draw(st.floats(NOW - 5, NOW + 3600))}
    run["attempts"] = [{**_valid(data, "attempt"), "entry_id": f"tests/{i}.py", "final": True, "skipped": 0,
                        "seconds": data.draw(st.floats(0, 1e8))} for i in range(data.draw(st.integers(0, 2)))]
    run["metrics"] = [{**_valid(data, "metric"), "entry_id": f"tests/{i}.py",
                       "value": data.draw(st.floats(allow_nan=False, allow_infinity=False))}
                      for i in range(data.draw(st.integers(0, 2)))]
    for _ in range(data.draw(st.integers(0, 2))):
        _spoil(data, run)
    return run


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_what_the_ingest_accepts_the_store_holds_whole(store_url: str, tmp_path: Path,
                                                       data: st.DataObject) -> None:
    folder = tmp_path / uuid.uuid4().hex
    folder.mkdir()
    uids = [uuid.uuid4().hex for _ in range(data.draw(st.integers(1, 3)))]
    for uid in uids:
        (folder / f"{uid}.json").write_text(json.dumps(_drawn_run(data, uid)))
    with open_store(store_url) as store:
        before = store.counts()
        refusal, runs = "", []
        try:
            runs = collect(folder, trigger=PR12, now=NOW)
        except UsageError as exc:
            refusal = str(exc)
        if refusal:
            event("refused")
            assert refusal.endswith("nothing ingested") and "\n" not in refusal
            assert store.counts() == before
            return
        event("accepted")
        assert ingest(store, runs) == len(uids)  # never a RecordRefused: the bounds are the columns'
        stored = {r.uid: r for r in store.runs() if r.uid in uids}
    assert sorted(stored) == sorted(uids)
    for run in runs:
        assert stored[run.uid].attempts == run.attempts and stored[run.uid].metrics == run.metrics
        assert (stored[run.uid].suite, stored[run.uid].started_at) == (run.suite, run.started_at)


# --- the snapshot never reads the runs it leaves out ----------------------------------------------

def test_the_snapshot_reads_no_row_of_an_untrusted_run(tmp_path: Path, store_url: str) -> None:
    """15,000 metric points of PR runs beside one trusted run: the snapshot's memory is what
    the trusted run needs (a query that loads every point and filters after takes ~3.5 MB)."""
    def points(n: int) -> tuple[MetricPoint, ...]:
        return tuple(MetricPoint(entry_id="tests/e.py", step=i, name="loss", value=i / 7) for i in range(n))

    with open_store(store_url) as store:
        store.record(RunRecord(uid="0" * 32, suite="s", hardware="cuda", started_at=1.0, ended_at=2.0,
                               exit_code=0, metrics=points(10)))
        store.record_all([RunRecord(uid=f"{n:032x}", suite="s", hardware="cuda", started_at=1.0 + n,
                                    ended_at=2.0 + n, exit_code=0, trusted=False, pr=3, metrics=points(5000))
                          for n in range(1, 4)])
        tracemalloc.start()
        try:
            kept = snapshot(store, tmp_path / "snapshot.sqlite")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert kept == 1
    assert peak < 1_500_000, f"{peak / 1e6:.1f} MB"
    with open_store(f"sqlite:///{tmp_path / 'snapshot.sqlite'}", create=False) as copy:
        (run,) = copy.runs()
        assert (run.uid, len(run.metrics)) == ("0" * 32, 10)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
