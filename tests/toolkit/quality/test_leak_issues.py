"""`python -m ci select-audit --issues`: the monitor keeps one issue per entry whose catch the
selection by executed code would miss, and closes it once the audit selects the entry again.

A scratch checkout with a GPU suite of two entries, a plant for each and a records file
(written through the records store's own `save`), a real SQLite file or PostgreSQL server as
the history. GitHub's API is the loopback stand-in of tests/toolkit/_github_api.py (this
machine has no GitHub); the audit, the store and the command are the real ones.
"""

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import write
from _github_api import env_for, fake_github
from _verdict_store import in_process

from ci.select.executed import MODULE, RECORDS_FILE, Record, save

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", label="run-ci-train", entries=(
            Entry(path="tests/e2e/test_loads.py"), Entry(path="tests/e2e/test_trains.py", owner="@trainer"))),
    )
"""
SCRIPT = "NUM_GPUS = 1\n\n\ndef execute():\n    pass\n\n\nif __name__ == '__main__':\n    execute()\n"
LIB = "import os\n\n\ndef load(path):\n    return path\n\n\ndef train(steps):\n    return steps\n"
PATCH = """suite: train
only: tests/e2e/test_trains.py
reason: broken

diff --git a/pkg/lib.py b/pkg/lib.py
--- a/pkg/lib.py
+++ b/pkg/lib.py
@@ -9 +9 @@ def train(steps):
-    return steps
+    return 0
"""
LOADS, TRAINS = "tests/e2e/test_loads.py", "tests/e2e/test_trains.py"


@pytest.fixture
def audit(capsys, monkeypatch):
    return in_process(capsys, monkeypatch, "select-audit")


@pytest.fixture
def issues(capsys, monkeypatch):
    return in_process(capsys, monkeypatch, "issues")


def checkout(tmp_path: Path) -> Path:
    return write(tmp_path / "repo", {
        "ci/registry/repo_suites.py": REGISTRY, f"{LOADS}": SCRIPT, f"{TRAINS}": SCRIPT, "pkg/lib.py": LIB,
        "tests/e2e/plants/test_trains/train-broken.patch": PATCH,
    })


def recording(root: Path, trains_runs: tuple[str, ...], at: float) -> None:
    save(root / RECORDS_FILE, [
        Record(entry=LOADS, commit="c", recorded_at=at, files={"pkg/lib.py": (MODULE, "load")}),
        Record(entry=TRAINS, commit="c", recorded_at=at, files={"pkg/lib.py": trains_runs}),
    ])


def leak_issues(gh) -> list[dict]:
    return [i for i in gh.issues if "kind=selection-leak" in i["body"]]


def test_a_missed_plant_opens_an_issue_that_closes_once_the_selection_runs_it(store_url, tmp_path, audit,
                                                                               issues):
    root = checkout(tmp_path)
    recording(root, (MODULE, "load"), at=time.time() - 1000)  # a record that never trains: a leak
    with fake_github() as (api, gh):
        env = env_for(api)
        first = audit(root, store_url, "--issues", env=env)
        assert first.returncode == 0, first.stderr  # with --issues, the issue is the alert
        assert "recall 0.00 (0 of 1 plants" in first.stdout
        [issue] = leak_issues(gh)
        assert issue["body"].startswith(f"<!-- slime-ci:entry={TRAINS} kind=selection-leak -->")
        assert issue["title"] == f"Selection would miss: {TRAINS} (train)"
        assert "plant `test_trains/train-broken`: `executes none of the changed code`" in issue["body"]
        assert "owner: @trainer" in issue["body"] and issue["assignees"] == ["trainer"]

        again = audit(root, store_url, "--issues", env=env)  # still missed: left as it is
        assert again.returncode == 0 and len(leak_issues(gh)) == 1 and "updated" not in again.stdout

        recording(root, (MODULE, "train"), at=time.time() - 500)  # recorded again: it trains
        plain = issues(root, store_url, env=env)  # the monitor's other issues leave it alone
        assert plain.returncode == 0 and issue["state"] == "open"
        closing = audit(root, store_url, "--issues", env=env)
        assert closing.returncode == 0, closing.stderr
        assert issue["state"] == "closed"
        assert f"closed #{issue['number']}: {TRAINS} (the leak audit selects it again" in closing.stdout

        recording(root, (MODULE, "load"), at=time.time() + 5)  # a newer recording misses it again
        reopened = audit(root, store_url, "--issues", env=env)
        assert issue["state"] == "open" and len(leak_issues(gh)) == 1, "the same issue comes back"
        assert f"reopened #{issue['number']}" in reopened.stdout


def test_dry_run_and_no_token_change_nothing(tmp_path, audit):
    root = checkout(tmp_path)
    recording(root, (MODULE, "load"), at=time.time())
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    with fake_github() as (api, gh):
        dry = audit(root, url, "--issues", "--dry-run", env=env_for(api))
        laptop = audit(root, url, "--issues", "--unreachable-ok")
        stray = audit(root, url, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would open an issue: selection-leak {TRAINS} (the selection would miss its catch)" in dry.stdout
    assert laptop.returncode == 0 and "issues skipped, no GITHUB_TOKEN" in laptop.stderr
    assert stray.returncode == 2 and "go with --issues" in stray.stderr
    assert gh.issues == []


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
