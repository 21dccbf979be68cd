"""Port blocks of emulated runs: two runs at once never hand the same ports to their entries.

Real processes contend for real lock files: each holder is a separate interpreter that
claims a range, reports it, and keeps it until told to stop.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

from ci.gpu.ports import EMULATED_FLOOR, PORT_BLOCK, PORT_CEILING, claimed_floor, port_base

NUM_GPUS = 0

HOLDER = """
import sys
from ci.gpu.ports import claimed_floor
with claimed_floor(int(sys.argv[1]), sys.argv[2]) as first:
    print(first, flush=True)
    sys.stdin.readline()
"""


def _holder(gpus: int, lock_dir: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(gpus), lock_dir], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    assert proc.stdout is not None
    proc.stdout.close()


def test_concurrent_runs_get_disjoint_ranges(tmp_path):
    held = [_holder(gpus, str(tmp_path)) for gpus in (8, 4, 8)]
    try:
        spans = sorted((first, first + gpus * PORT_BLOCK) for (_, first), gpus in zip(held, (8, 4, 8), strict=True))
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, f"ranges overlap: {spans}"
        assert spans[0][0] >= EMULATED_FLOOR and spans[-1][1] <= PORT_CEILING
    finally:
        for proc, _ in held:
            _release(proc)


def test_a_released_range_is_claimed_again(tmp_path):
    proc, first = _holder(8, str(tmp_path))
    _release(proc)
    with claimed_floor(8, str(tmp_path)) as again:
        assert again == first == EMULATED_FLOOR


def test_entry_blocks_follow_the_run_floor():
    assert port_base((3, 4)) == 20000 + 3 * PORT_BLOCK
    assert port_base((0,), EMULATED_FLOOR) == EMULATED_FLOOR


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
