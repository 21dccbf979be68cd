"""GPU suites on emulated GPUs: concurrent entries under real locks, isolation, plan-time errors."""

import json
import sys
from itertools import combinations
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci, write

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
              exclude=("tests/e2e",)),
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", label="run-ci-train",
              image="example/train:1", timeout=120, entries=(
            Entry(path="tests/e2e/test_job.py", test_args=("--tag", "a")),
            Entry(path="tests/e2e/test_job.py", test_args=("--tag", "b")),
            Entry(path="tests/e2e/test_pair.py", test_args=("--tag", "p1")),
            Entry(path="tests/e2e/test_pair.py", test_args=("--tag", "p2"),
                  env=(("SLIME_TEST_USE_DEEPEP", "1"),)),
            Entry(path="tests/e2e/test_cfg.py", test_args=("--tag", "cfg"), cpu_only=True),
        )),
        Suite(name="forever", tier="gpu", purpose="p", profile="e2e", entries=(
            Entry(path="tests/e2e/test_third_time_fails.py"),
        )),
    )
"""

RECORDER = """
    import json, os, sys, time
    NUM_GPUS = {n}

    def execute(tag):
        start = time.time()
        time.sleep(1.0)
        keys = ("SLIME_CI_GPUS", "CUDA_VISIBLE_DEVICES", "SLIME_CI_DEVICE", "SLIME_CI_EMULATE_GPUS",
                "SLIME_CI_PORT_BASE", "TMPDIR", "SLIME_CI_OUTPUT_DIR", "NUM_GPUS",
                "SLIME_TEST_USE_DEEPEP", "SLIME_CI_ENTRY")
        record = {{"tag": tag, "start": start, "end": time.time(),
                   "tmp_exists": os.path.isdir(os.environ["TMPDIR"]),
                   **{{k: os.environ.get(k) for k in keys}}}}
        with open(os.environ["RECORD"], "a") as fh:
            fh.write(json.dumps(record) + "\\n")

    if __name__ == "__main__":
        execute(sys.argv[sys.argv.index("--tag") + 1])
"""

THIRD_TIME_FAILS = """
    import os
    NUM_GPUS = 1
    COUNTER = os.environ["COUNTER"]

    def execute():
        runs = int(open(COUNTER).read()) + 1 if os.path.exists(COUNTER) else 1
        open(COUNTER, "w").write(str(runs))
        if runs == 3:
            raise SystemExit("third run fails")

    if __name__ == "__main__":
        execute()
"""


@pytest.fixture
def checkout(tmp_path):
    return write(tmp_path, {
        "ci/registry/repo_suites.py": REGISTRY,
        "tests/e2e/test_job.py": RECORDER.format(n=1),
        "tests/e2e/test_pair.py": RECORDER.format(n=2),
        "tests/e2e/test_cfg.py": RECORDER.format(n=0),
        "tests/e2e/test_third_time_fails.py": THIRD_TIME_FAILS,
    })


def _records(path):
    return {r["tag"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_concurrent_entries_never_share_a_gpu(checkout, tmp_path):
    record = tmp_path / "record.jsonl"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = run_ci("run", "--suite", "train", "--root", str(checkout), "--emulate-gpus",
                  "--gpus", "3", env={"RECORD": str(record), "TMPDIR": str(scratch)}, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(scratch.iterdir()) == [], "the run left its lock files or temp dirs behind"
    assert "train: 5 passed, 0 failed, 0 skipped" in proc.stdout.splitlines()
    runs = _records(record)
    assert set(runs) == {"a", "b", "p1", "p2", "cfg"}
    gpu_runs = {t: r for t, r in runs.items() if t != "cfg"}
    for r in gpu_runs.values():
        ids = r["SLIME_CI_GPUS"].split(",")
        assert len(ids) == int(r["NUM_GPUS"])
        assert all(0 <= int(i) < 3 for i in ids)
        assert (r["SLIME_CI_DEVICE"], r["SLIME_CI_EMULATE_GPUS"], r["CUDA_VISIBLE_DEVICES"]) == ("cpu", "1", "")
        assert r["tmp_exists"]
    overlapped = 0
    for x, y in combinations(gpu_runs.values(), 2):
        if x["start"] < y["end"] and y["start"] < x["end"]:
            overlapped += 1
            assert not set(x["SLIME_CI_GPUS"].split(",")) & set(y["SLIME_CI_GPUS"].split(",")), (x, y)
            assert x["SLIME_CI_PORT_BASE"] != y["SLIME_CI_PORT_BASE"]
            assert x["TMPDIR"] != y["TMPDIR"]
            assert x["SLIME_CI_OUTPUT_DIR"] != y["SLIME_CI_OUTPUT_DIR"]
    assert overlapped >= 1, "nothing ran concurrently on 3 GPUs"
    assert runs["cfg"]["SLIME_CI_GPUS"] == ""  # 0-GPU entries take no lock
    assert runs["p2"]["SLIME_TEST_USE_DEEPEP"] == "1"
    assert runs["a"]["SLIME_TEST_USE_DEEPEP"] == "0"  # the original's default flags are set
    assert runs["p1"]["SLIME_CI_ENTRY"] == "tests/e2e/test_pair.py --tag p1"


def test_entry_larger_than_the_machine_fails_at_plan_time(checkout):
    proc = run_ci("run", "--suite", "train", "--root", str(checkout), "--emulate-gpus", "--gpus", "1")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: tests/e2e/test_pair.py --tag p1 needs 2 GPUs but this run "
                                   "may use 1 (--gpus); 2 entries too large")


def test_shards_partition_the_suite(checkout):
    seen = []
    for i in (1, 2):
        proc = run_ci("run", "--suite", "train", "--root", str(checkout), "--gpus", "8",
                      "--shard", f"{i}/2", "--dry-run", "--no-docker")
        assert proc.returncode == 0, proc.stderr
        seen.append({line.strip().split("  ")[0] for line in proc.stdout.splitlines()
                     if line.startswith("  tests/")})
    assert seen[0] and seen[1]
    assert not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == 5


def test_infinite_run_repeats_until_a_failure(checkout, tmp_path):
    counter = tmp_path / "count"
    proc = run_ci("run", "--suite", "forever", "--root", str(checkout), "--emulate-gpus", "--gpus", "1",
                  env={"COUNTER": str(counter), "SLIME_TEST_ENABLE_INFINITE_RUN": "1"}, timeout=120)
    assert proc.returncode == 1
    assert counter.read_text() == "3"
    assert "third run fails" in proc.stdout


def test_unknown_option_of_a_gpu_suite_is_rejected(checkout):
    proc = run_ci("run", "--suite", "train", "--root", str(checkout), "--gpu", "8")
    assert proc.returncode == 2
    # No abbreviations: `--gpu` is not taken for `--gpus`.
    assert proc.stderr == "error: unknown option(s) for GPU suite train: --gpu\n"


def test_infinite_run_reads_the_flag_as_the_entries_do(capsys):
    """The runner and `U.get_bool_env_var` agree: only 1 and true (any case) turn it on."""
    import slime.utils.external_utils.command_utils as U
    from ci.run.command import _bool_env

    name = "SLIME_TEST_ENABLE_INFINITE_RUN"
    for raw in ("1", "true", " TRUE ", "0", "false", "", "yes", "on"):
        env = {name: raw}
        assert _bool_env(env, name) is U.get_bool_env_var(name, env=env), raw
    capsys.readouterr()
    assert _bool_env({name: "yes"}, name) is False
    assert "SLIME_TEST_ENABLE_INFINITE_RUN='yes' counts as false; use 1 or true" in capsys.readouterr().err


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
