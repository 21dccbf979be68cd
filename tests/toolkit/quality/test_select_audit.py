"""`python -m ci select-audit`: each plant's patch, and each commit a bisect blamed, replayed
against the records: recall and GPU-seconds.

A scratch checkout with a GPU suite of two entries, a CPU suite, three plants and a records
file. The records are written through the store's own `save` (what a recording run writes;
the recording itself is proven in tests/toolkit/run/test_record_executed.py). Blamed commits
are real commits of a git repository made of the checkout, and the bisect answers naming
them real rows of a SQLite history store, written by `record_bisects` of ci/history/bisects.py.
"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci, write
from _gitrepo import git

from ci.history.bisects import record_bisects
from ci.history.store import open_store
from ci.select.executed import MODULE, RECORDS_FILE, Record, blob_id, save, spans

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
              exclude=("tests/e2e",)),
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", label="run-ci-train",
              image="example/train:1", entries=(
            Entry(path="tests/e2e/test_loads.py"),
            Entry(path="tests/e2e/test_trains.py"),
        )),
    )
"""

SCRIPT = """
    NUM_GPUS = 2

    def execute():
        pass

    if __name__ == "__main__":
        execute()
"""

UNIT = """
    import pytest
    NUM_GPUS = 0

    def test_it():
        assert True
"""

LIB = """
    import os


    def load(path):
        return path


    def train(steps):
        return steps
"""


def plant(suite: str, only: str, body: str) -> str:
    return f"suite: {suite}\nonly: {only}\nreason: broken\n\n" + body


IN_LOAD = """diff --git a/pkg/lib.py b/pkg/lib.py
--- a/pkg/lib.py
+++ b/pkg/lib.py
@@ -5 +5 @@ def load(path):
-    return path
+    return None
"""
IN_TRAIN = IN_LOAD.replace("@@ -5 +5 @@ def load(path):\n-    return path\n+    return None",
                           "@@ -9 +9 @@ def train(steps):\n-    return steps\n+    return 0")


@pytest.fixture
def checkout(tmp_path):
    root = write(tmp_path, {
        "ci/registry/repo_suites.py": REGISTRY, "tests/e2e/test_loads.py": SCRIPT,
        "tests/e2e/test_trains.py": SCRIPT, "tests/test_unit.py": UNIT, "pkg/lib.py": LIB,
        "tests/durations.json": json.dumps({"tests/e2e/test_loads.py": 100.0,
                                            "tests/e2e/test_trains.py": 300.0}),
    })
    plants = root / "tests/e2e/plants"
    (plants / "test_loads").mkdir(parents=True)
    (plants / "test_trains").mkdir(parents=True)
    (plants / "test_unit").mkdir(parents=True)
    (plants / "test_loads/load-broken.patch").write_text(plant("train", "tests/e2e/test_loads.py", IN_LOAD))
    (plants / "test_trains/train-broken.patch").write_text(plant("train", "tests/e2e/test_trains.py", IN_TRAIN))
    (plants / "test_unit/unit-broken.patch").write_text(plant("unit", "tests/test_unit.py", IN_LOAD))
    return root


def recording(root: Path, trains_runs: tuple[str, ...]) -> None:
    save(root / RECORDS_FILE, [
        Record(entry="tests/e2e/test_loads.py", commit="c", recorded_at=1.0,
               files={"pkg/lib.py": (MODULE, "load")}),
        Record(entry="tests/e2e/test_trains.py", commit="c", recorded_at=1.0,
               files={"pkg/lib.py": trains_runs}),
    ])


def test_every_plant_selected_passes_with_the_gpu_seconds_saved(checkout):
    recording(checkout, (MODULE, "train"))
    proc = run_ci("select-audit", "--root", str(checkout))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "recall 1.00 (3 of 3 plants" in out
    # load broken: 2 GPUs x 100 s of 2 x (100 + 300); train broken: 2 x 300 of the same.
    assert "GPU-seconds selected / all entries of their suites: 800 / 1600 = 0.50" in out
    row = next(line for line in out.splitlines() if line.startswith("test_loads/load-broken"))
    assert "1 of 2" in row and "executes pkg/lib.py:load" in row
    assert "a CPU suite runs every entry" in out


def test_a_plant_the_selection_would_miss_fails_the_audit(checkout):
    recording(checkout, (MODULE, "load"))  # its record claims it never trains
    proc = run_ci("select-audit", "--root", str(checkout))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("test_trains/train-broken"))
    assert "MISSED" in row and "executes none of the changed code" in row
    assert "recall 0.67 (2 of 3 plants" in proc.stdout


def test_entries_without_records_always_run_and_are_counted(checkout):
    proc = run_ci("select-audit", "--root", str(checkout))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 of 2 GPU entries have no record and always run" in proc.stdout
    assert "1600 / 1600 = 1.00" in proc.stdout


# A plant made before two lines were added at the top of pkg/lib.py: its numbers are stale,
# and `git apply` finds the hunk by its context.
STALE = """diff --git a/pkg/lib.py b/pkg/lib.py
--- a/pkg/lib.py
+++ b/pkg/lib.py
@@ -7,3 +7,3 @@
{blank}
 def train(steps):
-    return steps
+    return 0
""".format(blank=" ")


def test_a_plant_made_on_an_older_file_is_read_where_it_lands_today(checkout):
    lib = checkout / "pkg/lib.py"
    lib.write_text("# header\nLIMIT = 1\n" + lib.read_text())
    text = lib.read_text().splitlines()
    at = {line.strip(): n for n, line in enumerate(text, 1) if line.strip()}
    imported = {at["LIMIT = 1"], at["import os"], at["def load(path):"], at["def train(steps):"]}
    blob = blob_id(lib.read_bytes())
    save(checkout / RECORDS_FILE, [  # the records keep lines: the block the change lands in decides
        Record(entry="tests/e2e/test_loads.py", commit="c", recorded_at=1.0, files={"pkg/lib.py": (MODULE, "load")},
               lines={"pkg/lib.py": spans(imported | {at["return path"]})}, blobs={"pkg/lib.py": blob}),
        Record(entry="tests/e2e/test_trains.py", commit="c", recorded_at=1.0, files={"pkg/lib.py": (MODULE, "train")},
               lines={"pkg/lib.py": spans(imported | {at["return steps"]})}, blobs={"pkg/lib.py": blob}),
    ])
    (checkout / "tests/e2e/plants/test_trains/train-broken.patch").write_text(
        plant("train", "tests/e2e/test_trains.py", STALE))
    proc = run_ci("select-audit", "--root", str(checkout))
    row = next(line for line in proc.stdout.splitlines() if line.startswith("test_trains/train-broken"))
    # By its own numbers the change is old line 9, a blank line here: no block, a miss.
    assert "yes" in row and f"executes pkg/lib.py:train lines {at['return steps']}-" in row, proc.stdout
    # load-broken has no context and does not apply (`git apply` wants context): its stale
    # line 5, blank now, is read by functions alone, and a blank line at the top level is the
    # module's: both entries run.
    row = next(line for line in proc.stdout.splitlines() if line.startswith("test_loads/load-broken"))
    assert "yes" in row and "2 of 2" in row and "(module level changed)" in row, proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr


def blame(root: Path, store: Path, entry: str, sha: str, kind: str = "first-bad") -> None:
    """A bisect answer in the store: `sha` broke `entry` of suite train."""
    with open_store(f"sqlite:///{store}") as s:
        record_bisects(s, [{
            "uid": f"{entry}-{sha}-{kind}", "suite": "train", "entry_id": entry, "good": "g", "bad": "b",
            "kind": kind, "commit": sha, "candidates": sha, "confidence": 0.99, "attempts_per_commit": 1,
            "width": 1, "rounds": 1, "steps": 1, "trigger": "cli", "started_at": 1.0, "ended_at": 2.0,
            "summary": f"{sha[:7]} broke it"}])


def commit_change(root: Path, old: str, new: str, message: str) -> str:
    lib = root / "pkg/lib.py"
    lib.write_text(lib.read_text().replace(old, new))
    git(root, "commit", "-q", "-am", message)
    return git(root, "rev-parse", "HEAD")


@pytest.fixture
def history(checkout):
    git(checkout, "init", "-q", "-b", "main")
    git(checkout, "add", "-A")
    git(checkout, "commit", "-q", "-m", "start")
    return checkout / "history.db"


def test_a_blamed_commit_is_replayed_and_its_entry_selected(checkout, history):
    recording(checkout, (MODULE, "train"))
    sha = commit_change(checkout, "return steps", "return 0", "break train")
    blame(checkout, history, "tests/e2e/test_trains.py", sha)
    start = git(checkout, "rev-parse", "HEAD^")
    blame(checkout, history, "tests/e2e/test_loads.py", start, kind="undetermined")  # blames nothing
    proc = run_ci("select-audit", "--root", str(checkout), "--history", f"sqlite:///{history}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith(sha[:10])]
    assert len(rows) == 1, proc.stdout
    assert start[:10] not in proc.stdout + proc.stderr, "an undetermined answer is no case"
    assert "yes" in rows[0] and "1 of 2" in rows[0] and "executes pkg/lib.py:train" in rows[0]
    assert "recall 1.00 (1 of 1 blamed commits" in proc.stdout


def test_a_blamed_commit_the_selection_would_miss_fails_the_audit(checkout, history):
    recording(checkout, (MODULE, "train"))
    # The bisect says this change to load broke the training entry, whose record never ran
    # load: what selection would have missed (a leak).
    sha = commit_change(checkout, "return path", "return None", "break load")
    blame(checkout, history, "tests/e2e/test_trains.py", sha)
    proc = run_ci("select-audit", "--root", str(checkout), "--history", f"sqlite:///{history}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith(sha[:10]))
    assert "MISSED" in row and "executes none of the changed code" in row
    assert "recall 0.00 (0 of 1 blamed commits" in proc.stdout
    assert "recall 1.00 (3 of 3 plants" in proc.stdout  # the blamed commit alone fails it


def test_a_blamed_commit_this_checkout_lacks_is_named_and_left_out(checkout, history):
    recording(checkout, (MODULE, "train"))
    blame(checkout, history, "tests/e2e/test_trains.py", "0" * 40)
    blame(checkout, history, "tests/e2e/test_gone.py", git(checkout, "rev-parse", "HEAD"))
    proc = run_ci("select-audit", "--root", str(checkout), "--history", f"sqlite:///{history}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "left out blamed commit 0000000000 tests/e2e/test_trains.py: this checkout lacks it" in proc.stderr
    assert "tests/e2e/test_gone.py: the entry is no longer in suite 'train'" in proc.stderr
    assert "no blamed commit to replay" in proc.stdout


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
