"""Holder records of any content, written into a really held lock file: `gpu-status`, its JSON
and another waiter's timeout message read them as far as they make sense, and never crash.

Any local user can write a lock file of their own (and a holder of a shared one its record),
so every field is open-ended input: NaN, 1e300, 400-digit integers, nested lists."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO
from _lock_helpers import held_with

from ci.errors import WaitTimeout
from ci.gpu import allocator, lock_gpus

NUM_GPUS = 0
pytestmark = pytest.mark.timeout(120)  # a wait gone wrong fails, never hangs the suite

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
    | st.sampled_from([1e300, -1e300, 10**400, 2**64, -1, 0, 2**32, 604801.0]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
FIELDS = ("pid", "command", "since", "host", "child_pid", "expect", "ticket", "passed")
RECORDS = st.dictionaries(st.sampled_from(FIELDS), JSON) | JSON


def _no_constant(name: str) -> object:
    raise AssertionError(f"{name} in JSON output")


@settings(max_examples=75, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(record=RECORDS)
def test_any_holder_record_is_shown_and_named_in_a_timeout_without_a_crash(tmp_path, record):
    pattern = str(tmp_path / "gpu_{gpu_id}.lock")
    with held_with(pattern, 0, json.dumps(record).encode()):
        req = allocator.make_request(count=2, total_gpus=2)
        number, fd, path = allocator._new_ticket(pattern, req, {"pid": os.getpid()})
        try:
            st_ = allocator.read_status(pattern, 2)
            table = lock_gpus.format_status(st_)
            out = json.loads(lock_gpus.status_as_json(st_), parse_constant=_no_constant)
            with pytest.raises(WaitTimeout) as info:
                allocator.acquire(devices=[0], total_gpus=2, lock_path_pattern=pattern, timeout=0)
        finally:
            allocator._drop_ticket(fd, path)
    holder = st_.gpus[0].holder
    assert holder is not None and st_.head == number
    assert holder.pid is None or 0 <= holder.pid < 2**63
    assert holder.since is None or 0 <= holder.since < 2**32
    assert holder.expect is None or 0 < holder.expect <= allocator.MAX_EXPECT
    assert st_.reservation is not None and (math.isinf(st_.reservation)
                                            or math.isfinite(st_.reservation))
    assert isinstance(holder.command, str) and "0    held" in table
    assert out["gpus"][0]["state"] == "held"
    assert "\n" not in str(info.value) and "held by" in str(info.value)


def _forged(pattern: str, record: dict[str, object]) -> Iterator[None]:
    return held_with(pattern, 0, json.dumps(record).encode())


@pytest.mark.parametrize("record", [
    {"pid": 1, "since": 1e300, "command": "x"},  # OverflowError in time.localtime
    {"pid": 1, "since": float("nan")},  # ValueError: Invalid value NaN
    {"pid": 10**400 // 10**380, "since": 10**400 // 10**300},  # float() of a huge int
])
def test_a_forged_holder_record_leaves_another_waiter_a_one_line_timeout(tmp_path, record):
    pattern = str(tmp_path / "gpu_{gpu_id}.lock")
    with _forged(pattern, record):
        res = subprocess.run([sys.executable, "-m", "ci", "lock-gpus", "--lock-path-pattern",
                              pattern, "--total-gpus", "1", "--count", "1", "--timeout", "0.1",
                              "--", "true"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 124, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith("error: timed out after 0.1s waiting for 1 GPU(s): GPU 0 is held")


def test_gpu_status_shows_a_holder_expecting_1e300_seconds_with_a_head_behind_it(tmp_path):
    pattern = str(tmp_path / "gpu_{gpu_id}.lock")
    with _forged(pattern, {"pid": os.getpid(), "since": time.time(), "expect": 1e300}):
        req = allocator.make_request(count=2, total_gpus=2)
        number, fd, path = allocator._new_ticket(pattern, req, {"pid": os.getpid()})
        try:
            res = subprocess.run([sys.executable, "-m", "ci", "gpu-status", "--lock-path-pattern",
                                  pattern, "--total-gpus", "2"], cwd=REPO, capture_output=True,
                                 text=True, timeout=60)
        finally:
            allocator._drop_ticket(fd, path)
    # Past a week an expectation means nothing: the holder reads as one without any.
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert f"#{number} pid {os.getpid()}" in res.stdout
    assert "head, reserved now: its GPUs may free up any moment" in res.stdout


@pytest.mark.parametrize("value", ["1e300", "604801"])
def test_an_expectation_past_a_week_is_refused_in_one_line(tmp_path, value):
    res = subprocess.run([sys.executable, "-m", "ci", "lock-gpus", "--lock-path-pattern",
                          str(tmp_path / "gpu_{gpu_id}.lock"), "--total-gpus", "1", "--count",
                          "1", "--expect", value, "--", "true"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr == f"error: --expect {float(value):g}: must be at most 604800 seconds\n"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
