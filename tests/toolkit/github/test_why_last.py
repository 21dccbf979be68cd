"""`python -m ci why --last`: a laptop's last run, judged against main's trusted history before
any push.

The local run is real (`python -m ci run` on a CPU suite with a planted failing file, which
records into the checkout's own store). main's history is planted trusted runs, in the trusted
snapshot the ingest job makes (ci.history.ingest.snapshot) or in a store named by
SLIME_CI_HISTORY_URL, which `why --last` must leave as it was.
"""

import hashlib
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import PASSING, write
from _verdict_store import LAPTOP_REGISTRY, laptop_run, why_command

from ci.github.why_last import SNAPSHOT_FILE
from ci.history.ingest import snapshot
from ci.history.rows import AttemptRecord, RunRecord
from ci.history.store import open_store

NUM_GPUS = 0


@pytest.fixture
def why(capsys, monkeypatch):
    return why_command(capsys, monkeypatch)


@pytest.fixture(scope="module")
def laptop(tmp_path_factory):
    return laptop_run(tmp_path_factory.mktemp("laptop"))


def _main(url: str) -> None:
    """main's trusted runs: test_a passes; test_b failed in its last run."""
    with open_store(url) as store:
        for n, b in ((1, "passed"), (2, "failed")):
            tries = tuple(AttemptRecord(entry_id=p, path=p, attempt=1, final=True, outcome=o, seconds=1.0,
                                        reason="AssertionError: planted" if o == "failed" else "",
                                        exit_code=int(o == "failed"))
                          for p, o in (("tests/test_a.py", "passed"), ("tests/test_b.py", b)))
            store.record(RunRecord(uid=f"{n}" * 32, suite="unit", commit=f"{n}" * 40, branch="main", event="push",
                                   hardware="cpu", started_at=float(n), ended_at=n + 1.0, exit_code=0,
                                   trusted=True, attempts=tries))


def _kinds(stdout: str) -> dict[str, str]:
    return {v["entry_id"]: v["kind"] for v in json.loads(stdout)}


WANTED = {"tests/test_a.py": "new", "tests/test_b.py": "already-failing"}


def test_against_the_trusted_snapshot_it_gives_the_verdicts_the_pr_would_get(laptop, tmp_path, why):
    shared = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    _main(shared)
    with open_store(shared) as store:
        snapshot(store, laptop / SNAPSHOT_FILE)
    try:
        proc = why(laptop, None, "--last", "--json", "--gate")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert _kinds(proc.stdout) == WANTED
        text = why(laptop, None, "--last")
        assert f"in the snapshot {SNAPSHOT_FILE}" in text.stdout, text.stdout
    finally:
        (laptop / SNAPSHOT_FILE).unlink()


def test_against_the_shared_store_it_reads_and_never_writes(laptop, tmp_path, why):
    path = tmp_path / "shared.sqlite"
    _main(f"sqlite:///{path}")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    proc = why(laptop, None, "--last", "--json", env={"SLIME_CI_HISTORY_URL": f"sqlite:///{path}"})
    assert proc.returncode == 0, proc.stderr
    assert _kinds(proc.stdout) == WANTED
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before, "the shared store was written"


def test_without_a_baseline_one_line_and_exit_0(laptop, why):
    proc = why(laptop, None, "--last", "--gate")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.count("\n") == 1 and "python -m ci history pull" in proc.stdout, proc.stdout


def test_no_local_run_is_one_line_of_what_to_do(tmp_path, why):
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": LAPTOP_REGISTRY, "tests/test_a.py": PASSING})
    shared = tmp_path / "shared.sqlite"
    _main(f"sqlite:///{shared}")
    proc = why(root, None, "--last", env={"SLIME_CI_HISTORY_URL": f"sqlite:///{shared}"})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "run a suite first" in proc.stderr


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
