"""`invoke` tasks forward to `python -m ci` and keep the command after `--` exactly as typed."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _ci import REPO

NUM_GPUS = 0

INVOKE = shutil.which("invoke", path=str(Path(sys.executable).parent)) or shutil.which("invoke")
pytestmark = pytest.mark.skipif(INVOKE is None, reason="invoke is not installed in this environment")


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([INVOKE, *args], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=False)


def test_lock_gpus_keeps_quoting_and_sets_devices(tmp_path):
    pattern = str(tmp_path / "gpu_{gpu_id}.lock")
    proc = _invoke("lock-gpus", "--count", "2", "--total-gpus", "3", "--lock-path-pattern", pattern,
                   "--", sys.executable, "-c", "import os, sys; print(sys.argv[1:], os.environ['CUDA_VISIBLE_DEVICES'])",
                   "a  b", "it's")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['a  b', \"it's\"] 0,1"


def test_lock_gpus_exit_code_passes_through_and_bad_requests_exit_2(tmp_path):
    pattern = str(tmp_path / "gpu_{gpu_id}.lock")
    failing = _invoke("lock-gpus", "--count", "1", "--total-gpus", "2", "--lock-path-pattern", pattern,
                      "--", sys.executable, "-c", "raise SystemExit(7)")
    assert failing.returncode == 7
    too_many = _invoke("lock-gpus", "--count", "3", "--total-gpus", "2", "--lock-path-pattern", pattern,
                       "--", "true")
    assert too_many.returncode == 2
    assert too_many.stderr.strip().startswith("error: --count 3 is more than the 2 GPU(s)")


def test_lock_gpus_forwards_expect_and_no_backfill(tmp_path):
    pattern = str(tmp_path / "gpu_{gpu_id}.lock")
    bad = _invoke("lock-gpus", "--count", "1", "--total-gpus", "2", "--lock-path-pattern", pattern,
                  "--expect", "0", "--no-backfill", "--", "true")
    assert bad.returncode == 2 and "--expect 0" in bad.stderr, bad.stderr
    ok = _invoke("lock-gpus", "--count", "1", "--total-gpus", "2", "--lock-path-pattern", pattern,
                 "--expect", "5", "--no-backfill", "--", "true")
    assert ok.returncode == 0, ok.stderr


def test_audit_and_plan_tasks():
    audit = _invoke("audit")
    assert audit.returncode == 0, audit.stdout
    plan = _invoke("plan", "--event", "pull_request", "--labels", "run-ci-megatron")
    assert plan.returncode == 0
    assert "nox -s megatron" in plan.stdout


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
