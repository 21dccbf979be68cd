"""What a test writes, and what a spool or a store URL holds, can never crash a run or leak.

An entry's metrics.jsonl is read, never trusted: a 400-digit value, a step past the
store's integer column, NUL and lone surrogates in names. A record no column can hold is
refused in one line and never spooled (a poisoned spool would fail every later run);
a spooled one is set aside. A password in the store URL's query string is hidden in every
printed form, and commands that only read never create a store. SQLite and the real
PostgreSQL server, plus Hypothesis over what metrics.jsonl can hold.
"""

import json
import math
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci, write

from ci.history.record import PENDING_DIR, spool, write_after
from ci.history.rows import (
    STEP_MAX,
    AttemptRecord,
    MetricPoint,
    RunRecord,
    build_run,
    parse_metrics,
    read_metrics,
)
from ci.history.store import RecordRefused, _redact, check_record, describe, open_store
from ci.results import Result
from ci.select.entries import ResolvedEntry

NUM_GPUS = 0




def _run(uid: str, **fields) -> RunRecord:
    return RunRecord(**{"uid": uid, "suite": "s", "started_at": 1.0, "ended_at": 2.0, "exit_code": 0, **fields})


# ---- metrics.jsonl ----------------------------------------------------------------------

def test_huge_numbers_and_steps_in_metrics_are_skipped_not_raised():
    text = "\n".join([
        '{"step": 1, "loss": ' + "9" * 400 + ', "reward": 0.5}',  # past any float: that value goes
        '{"step": ' + str(2**63) + ', "late": 0.25}',  # past the column: the line number instead
        '{"step": 3, "kl": 1e400, "acc": -' + "1" * 400 + '}',
        '{"step": 4, "na\\u0000me": 1, "\\ud800x": 2}',
    ])
    points = {(p.step, p.name): p.value for p in parse_metrics("e", text)}
    assert points == {(1, "reward"): 0.5, (1, "late"): 0.25, (4, "name"): 1.0, (4, "?x"): 2.0}
    check_record(_run("m", metrics=parse_metrics("e", text)))


def test_a_metrics_fifo_is_skipped_never_waited_on(tmp_path):
    (tmp_path / "a").mkdir()
    os.mkfifo(tmp_path / "a" / "metrics.jsonl")  # nobody ever writes it: reading would hang
    assert read_metrics("e", tmp_path) == ()


LEARNER = """
    import json, os, pathlib
    NUM_GPUS = 1

    def execute():
        out = pathlib.Path(os.environ["SLIME_CI_OUTPUT_DIR"], "run")
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text(
            '{"step": 0, "reward": ' + "9" * 400 + '}\\n{"step": 1, "reward": 0.5}\\n'
            '{"step": 9223372036854775808, "reward": 0.75}\\n')

    if __name__ == "__main__":
        execute()
"""

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (Suite(name="train", tier="gpu", purpose="p", profile="e2e", timeout=60,
                    entries=(Entry(path="tests/e2e/test_learn.py"),)),)
"""


def test_a_run_whose_entry_writes_a_400_digit_metric_passes_and_is_recorded(tmp_path):
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY,
                                     "tests/e2e/test_learn.py": LEARNER})
    url = f"sqlite:///{root / '.ci-cache' / 'history.sqlite'}"
    done = run_ci("run", "--suite", "train", "--root", str(root), "--emulate-gpus", "--gpus", "1",
                  "--history", url, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "OverflowError" not in done.stdout + done.stderr
    assert "interrupted" not in done.stdout
    assert "history: recorded run" in done.stdout + done.stderr
    assert not (root / PENDING_DIR).exists()
    with open_store(url) as store:
        (run,) = store.runs()
    assert sorted((m.step, m.value) for m in run.metrics) == [(1, 0.5), (2, 0.75)]


# ---- records no column can hold -----------------------------------------------------------

def test_a_step_past_the_column_is_refused_in_one_line_and_never_spooled(store_url, tmp_path):
    bad = _run("bad-step", metrics=(MetricPoint(entry_id="e", step=2**63, name="x", value=1.0),))
    with open_store(store_url) as store:
        with pytest.raises(RecordRefused, match="step is past the 32-bit integer column"):
            store.record(bad)
        assert store.counts()["runs"] == 0
    warned: list[str] = []
    assert not write_after(store_url, bad, root=tmp_path, durations={}, warn=warned.append, note=print)
    assert len(warned) == 1 and "not spooled" in warned[0], warned
    assert not (tmp_path / PENDING_DIR).exists() or not list((tmp_path / PENDING_DIR).iterdir())


def test_a_poisoned_spool_file_is_set_aside_and_later_runs_record(store_url, tmp_path):
    # Written by a release that spooled anything: a step of 2**63 and NaN seconds.
    spool(_run("poison", metrics=(MetricPoint(entry_id="e", step=2**63, name="x", value=1.0),)), tmp_path)
    path = spool(_run("good"), tmp_path)
    nan = path.with_name("nan.json")
    nan.write_text(_run("nan").to_json().replace('"attempts": []', '"attempts": [{"entry_id": "e", '
                   '"path": "p", "attempt": 1, "final": true, "outcome": "passed", "seconds": NaN}]'))
    warned: list[str] = []
    for _ in range(2):  # the second run finds nothing left to replay
        assert write_after(store_url, _run(f"next-{_}"), root=tmp_path, durations={}, warn=warned.append,
                           note=lambda _line: None)
    assert len(warned) == 2 and all("never replayed" in w for w in warned), warned
    assert sorted(p.name for p in (tmp_path / PENDING_DIR).iterdir()) == ["nan.json.refused",
                                                                          "poison.json.refused"]
    with open_store(store_url) as store:
        assert sorted(r.uid for r in store.runs()) == ["good", "next-0", "next-1"]


def test_durations_the_store_cannot_hold_never_cost_the_run_its_record(store_url, tmp_path):
    warned: list[str] = []
    assert write_after(store_url, _run("kept"), root=tmp_path, durations={"tests/a\x00.py": 1.0},
                       warn=warned.append, note=lambda _line: None)
    assert len(warned) == 1 and "durations.json not imported" in warned[0], warned
    with open_store(store_url) as store:
        assert [r.uid for r in store.runs()] == ["kept"]


def test_a_shard_run_the_store_cannot_hold_leaves_the_merge_going(store_url, tmp_path, monkeypatch):
    import ci.history.store as store_module
    from ci.history.job import merge_stores

    shard = tmp_path / "shard" / "history.sqlite"
    with monkeypatch.context() as patched:  # SQLite keeps a branch past its column; PostgreSQL never
        patched.setattr(store_module, "check_record", lambda run: None)
        with open_store(f"sqlite:///{shard}") as store:
            assert store.record(_run("long", branch="b" * 300)) and store.record(_run("fine"))
    warned: list[str] = []
    with open_store(store_url) as store:
        assert merge_stores(store, [shard], warned.append) == 1
        assert [r.uid for r in store.runs()] == ["fine"]
    assert len(warned) == 1 and "branch is 300 characters, more than its 256" in warned[0], warned


def test_nan_seconds_is_refused_not_reported_as_already_recorded(store_url):
    nan = _run("nan", attempts=(AttemptRecord(entry_id="e", path="p", attempt=1, final=True,
                                              outcome="passed", seconds=math.nan),))
    with open_store(store_url) as store:
        with pytest.raises(RecordRefused, match="seconds nan is not a finite number"):
            store.record(nan)
        assert store.counts() == {"runs": 0, "attempts": 0, "metrics": 0}


@pytest.mark.parametrize(("fields", "why"), [
    ({"attempts": tuple(AttemptRecord(entry_id="e", path="p", attempt=1, final=True, outcome="passed")
                        for _ in range(2))}, "an attempt is listed twice"),
    ({"metrics": (MetricPoint(entry_id="e", step=1, name="x", value=1.0),) * 2}, "a metric point is listed twice"),
    ({"suite": "s\x00"}, "suite holds a NUL character"),
    ({"suite": "\udcff"}, "suite is not valid Unicode"),
    ({"pr": "7"}, "pr is str, not an integer"),
    ({"trusted": 1}, "trusted is int, not a boolean"),
    ({"started_at": 10**400}, "started_at is past any float"),
])
def test_a_hand_made_record_is_refused_naming_its_field(tmp_path, fields, why):
    with open_store(f"sqlite:///{tmp_path / 'h.sqlite'}") as store:
        with pytest.raises(RecordRefused, match=why):
            store.record(_run("hand", **fields))
        assert store.counts()["runs"] == 0


def test_an_integrity_error_is_already_recorded_only_when_the_uid_is_there(store_url, monkeypatch):
    # The check above skipped: the database's own constraint must not pass for "already there".
    import ci.history.store as store_module

    monkeypatch.setattr(store_module, "check_record", lambda run: None)
    twice = _run("twice", attempts=tuple(AttemptRecord(entry_id="e", path="p", attempt=1, final=True,
                                                       outcome="passed") for _ in range(2)))
    with open_store(store_url) as store:
        with pytest.raises(RecordRefused, match="cannot be recorded"):
            store.record(twice)
        assert store.counts()["runs"] == 0
        assert store.record(_run("once")) and not store.record(_run("once"))


def test_a_real_runs_text_is_made_storable(store_url):
    entry = ResolvedEntry(id="tests/e2e/test_x.py", path="tests/e2e/test_x.py", timeout=1.0, num_gpus=0,
                          kind="script")
    result = Result(entry=entry, outcome="failed", reason="bad byte \x00 and \udcff" + "x" * 900,
                    seconds=math.nan, node="n" * 300)
    run = build_run(uid="real", suite="s", results=[result], started_at=1.0, ended_at=2.0, exit_code=1,
                    context={"branch": "b" * 400, "commit": "c" * 80}, metrics={})
    with open_store(store_url) as store:
        assert store.record(run)
        (back,) = store.runs()
    assert len(back.branch) == 256 and back.attempts[0].reason.startswith("bad byte  and ?")
    assert back.attempts[0].seconds == 0.0


# ---- Hypothesis: whatever metrics.jsonl holds --------------------------------------------------

_json_scalar = st.one_of(
    st.none(), st.booleans(), st.text(max_size=8),
    st.integers(), st.integers(min_value=-(10**420), max_value=10**420),
    st.floats(allow_nan=True, allow_infinity=True))
_json_value = st.recursive(_json_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=6)
_row = st.dictionaries(st.one_of(st.just("step"), st.text(max_size=12)), _json_value, max_size=6)
_line = st.one_of(_row.map(lambda r: json.dumps(r, allow_nan=True)), st.text(max_size=40),
                  _json_value.map(lambda v: json.dumps(v, allow_nan=True)))
SETTINGS = settings(max_examples=150, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@SETTINGS
@given(lines=st.lists(_line, max_size=12))
def test_any_metrics_file_parses_to_points_the_store_can_hold(lines):
    text = "\n".join(lines)
    points = parse_metrics("e", text)
    check_record(_run("p", metrics=points))  # raises RecordRefused on anything no column holds
    assert len({(p.step, p.name) for p in points}) == len(points)
    assert all(math.isfinite(p.value) and abs(p.step) <= STEP_MAX + 1 for p in points)
    # Every finite number of a JSON object row is kept, under its step (else its line number).
    kept = {(p.step, p.name) for p in points}
    for number, line in enumerate(text.splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        step = row.get("step", number)
        if not isinstance(step, int) or isinstance(step, bool) or abs(step) >= 2**31:
            step = number
        for name, value in row.items():
            if name == "step" or "\x00" in name or any(0xD800 <= ord(c) <= 0xDFFF for c in name):
                continue
            if (type(value) is float and math.isfinite(value)) or (type(value) is int and abs(value) < 2**1000):
                assert (step, name) in kept, (step, name, value)


def test_a_generated_worst_case_is_recorded_on_the_store(store_url):
    rows = [{"step": s, "loss": 10**400 if s % 2 else s / 3, "na\u0000me": 1.5, "\ud800": 2.5, "big": 2**70}
            for s in range(20)] + [{"step": 2**63, "x": 1.0}]
    points = parse_metrics("e", "\n".join(json.dumps(r) for r in rows))
    with open_store(store_url) as store:
        assert store.record(_run("worst", metrics=points))
        (back,) = store.runs()
    assert len(back.metrics) == len(points) and points


# ---- the store URL and read-only commands ------------------------------------------------------

SECRET = "hunter2-secret"


def test_a_password_in_the_query_string_is_hidden_in_every_printed_form(tmp_path):
    for url in (f"postgresql+psycopg://ci@127.0.0.1:1/h?password={SECRET}&sslmode=disable",
                f"postgresql+psycopg://ci:{SECRET}@127.0.0.1:1/h?sslpassword={SECRET}"):
        assert SECRET not in describe(url) and "***" in describe(url), describe(url)
    assert "sslmode=disable" in describe(f"postgresql+psycopg://ci@h/db?password={SECRET}&sslmode=disable")
    for raw in (f"postgresql://ci@h:99999999/h?password={SECRET}",  # malformed: the raw text, redacted
                f"mysql://ci@h/db?sslmode=x&password={SECRET}", f"postgresql://ci:{SECRET}@h/?password={SECRET}"):
        assert SECRET not in _redact(raw), raw
    for url in (f"postgresql://ci@127.0.0.1:1/h?password={SECRET}",  # unreachable: exit 4, one line
                f"postgresql://ci@127.0.0.1:1/?password={SECRET}",  # no database: exit 2
                f"mysql://ci@127.0.0.1:1/h?password={SECRET}"):  # no such store: exit 2
        done = run_ci("history", "show", "--root", str(tmp_path), "--history", url)
        assert done.returncode in (2, 4) and done.stderr.count("\n") == 1, done.stderr
        assert SECRET not in done.stdout + done.stderr, done.stderr


def test_read_only_commands_never_create_a_store(tmp_path):
    for root in (tmp_path / "absent", tmp_path):
        for command in (["show"], ["flaky"], ["monitor"]):
            done = run_ci("history", *command, "--root", str(root))
            assert done.returncode == 4 and done.stderr.count("\n") == 1, done.stderr
            assert "no history store at" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "absent").exists() and not (tmp_path / ".ci-cache").exists()
    done = run_ci("history", "show", "--root", str(tmp_path), "--history",
                  f"sqlite:///{tmp_path / 'elsewhere' / 'h.sqlite'}")
    assert done.returncode == 4 and not (tmp_path / "elsewhere").exists()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
