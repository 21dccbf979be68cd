"""Selection by executed code: hunks to functions, leak paths, and each entry's reason.

The records here are written by hand to pin each rule; the records of a real emulated run,
and `plan --diff` on them, are in tests/toolkit/run/test_record_executed.py.
"""

import json
import sys
import textwrap
from pathlib import Path

import pytest

from ci.registry.model import SelectionPolicy
from ci.select.by_execution import Change, changes, leak, pick, whole_files
from ci.select.executed import (
    MODULE,
    RECORDS_FILE,
    Record,
    changed_functions,
    executed_functions,
    save,
    scopes,
)
from ci.select.unified_diff import parse_diff

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci, write

NUM_GPUS = 0

SOURCE = textwrap.dedent('''\
    import os
    LIMIT = 3


    @decorated
    def load(path):
        return open(path).read()


    class Saver:
        kind = "disk"

        def save(self, data):
            def write():
                return data
            return write()
''')
OLD = {"pkg/io.py": SOURCE}


def test_a_def_line_runs_with_its_module_and_a_body_line_with_its_function():
    found = scopes(SOURCE)
    assert executed_functions(found, [1, 6, 10, 11, 13]) == {MODULE, "Saver"}
    assert executed_functions(found, [7, 15, 16]) == {"load", "Saver.save.write", "Saver.save"}


def test_a_changed_signature_or_decorator_counts_for_its_function():
    found = scopes(SOURCE)
    assert changed_functions(found, [5]) == {"load"}
    assert changed_functions(found, [6]) == {"load"}
    assert changed_functions(found, [13]) == {"Saver.save"}
    assert changed_functions(found, [11]) == {"Saver"}
    assert changed_functions(found, [2]) == {MODULE}


def diff(body: str) -> str:
    return "diff --git a/pkg/io.py b/pkg/io.py\n--- a/pkg/io.py\n+++ b/pkg/io.py\n" + textwrap.dedent(body)


def test_hunks_map_to_the_functions_they_touch_on_both_sides():
    new = SOURCE.replace("return open(path).read()", "return open(path).read(10)")
    text = diff("""\
        @@ -7 +7 @@ def load(path):
        -    return open(path).read()
        +    return open(path).read(10)
        """)
    got = changes(parse_diff(text), OLD.get, {"pkg/io.py": new}.get)
    assert [(c.path, c.functions) for c in got] == [("pkg/io.py", frozenset({"load"}))]


def test_an_insertion_without_the_new_side_counts_for_both_neighbours():
    text = diff("""\
        @@ -15,2 +15,3 @@
                     return data
        +            print(data)
                 return write()
        """)
    got = changes(parse_diff(text), OLD.get, lambda _: None)
    assert got[0].functions == {"Saver.save.write", "Saver.save"}


def test_new_deleted_renamed_and_non_python_files_count_whole():
    text = ("diff --git a/pkg/new.py b/pkg/new.py\n--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
            "diff --git a/pkg/io.py b/pkg/moved.py\n--- a/pkg/io.py\n+++ b/pkg/moved.py\n@@ -2 +2 @@\n-LIMIT = 3\n+LIMIT = 4\n"
            "diff --git a/slime/cfg.yaml b/slime/cfg.yaml\n--- a/slime/cfg.yaml\n+++ b/slime/cfg.yaml\n@@ -1 +1 @@\n-a: 1\n+a: 2\n")
    got = {c.path: c.functions for c in changes(parse_diff(text), OLD.get, lambda _: None)}
    assert got == {"pkg/new.py": {MODULE}, "pkg/io.py": {MODULE}, "pkg/moved.py": {MODULE},
                   "slime/cfg.yaml": {MODULE}}


@pytest.mark.parametrize(("path", "leaks"), [
    ("pyproject.toml", True), ("constraints/py3.11.txt", True), ("noxfile.py", True),
    ("conftest.py", True), ("tests/e2e/conftest.py", True), ("ci/registry/repo_suites.py", True),
    ("docker/Dockerfile.e2e", True), ("Dockerfile", True), ("slime/configs/model.yaml", True),
    ("slime/loop.py", False), ("tests/e2e/test_rl_async.py", False), ("docs/history.md", False),
])
def test_leak_paths_are_the_registry_defaults(path, leaks):
    assert leak(path, SelectionPolicy()) is leaks


RECORDS = {
    "a": Record(entry="a", commit="c", recorded_at=0.0, files={"pkg/io.py": (MODULE, "load")}),
    "b": Record(entry="b", commit="c", recorded_at=0.0, files={"pkg/io.py": (MODULE, "Saver.save")}),
}
ENTRIES = (("a", "tests/test_a.py"), ("b", "tests/test_b.py"), ("c", "tests/test_c.py"))


def reasons(diff_changes):
    return {p.entry: (p.runs, p.reason) for p in pick(ENTRIES, diff_changes, RECORDS, SelectionPolicy())}


def test_each_entry_gets_its_reason():
    got = reasons((Change(path="pkg/io.py", functions=frozenset({"load"})),))
    assert got == {"a": (True, "executes pkg/io.py:load"),
                   "b": (False, "executes none of the changed code"),
                   "c": (True, "no record")}


def test_a_module_level_change_reaches_every_entry_that_ran_the_file():
    got = reasons(whole_files(["pkg/io.py"]))
    assert got["a"] == got["b"] == (True, "executes pkg/io.py (module level changed)")


def test_a_leak_runs_everything_and_an_own_file_runs_its_entry():
    assert {r for r, _ in reasons(whole_files(["pyproject.toml"])).values()} == {True}
    got = reasons(whole_files(["tests/test_b.py"]))
    assert got["b"] == (True, "own file tests/test_b.py changed")
    assert got["a"] == (False, "executes none of the changed code")


PLAN_REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", label="run-ci-train",
              image="example/train:1", entries=(Entry(path="tests/e2e/test_a.py"),
                                                Entry(path="tests/e2e/test_b.py"))),
    )
"""
SCRIPT = """
    NUM_GPUS = 1

    def execute():
        pass

    if __name__ == "__main__":
        execute()
"""


@pytest.fixture
def planned(tmp_path):
    root = write(tmp_path, {"ci/registry/repo_suites.py": PLAN_REGISTRY, "tests/e2e/test_a.py": SCRIPT,
                            "tests/e2e/test_b.py": SCRIPT, "pkg/io.py": SOURCE})
    save(root / RECORDS_FILE, [
        Record(entry="tests/e2e/test_a.py", commit="c", recorded_at=0.0, files={"pkg/io.py": (MODULE,)}),
        Record(entry="tests/e2e/test_b.py", commit="c", recorded_at=0.0, files={"tests/e2e/test_b.py": ("execute",)}),
    ])
    return root


def plan(root, *args):
    proc = run_ci("plan", "--root", str(root), *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_plan_table_says_how_many_entries_a_job_runs(planned):
    out = plan(planned, "--event", "pull_request", "--labels", "run-ci-train", "--paths", "pkg/io.py")
    assert "the PR has label run-ci-train; 1 of 2 entries" in out


def test_the_all_entries_label_and_dispatch_run_every_entry(planned):
    for args, reason in ((("--event", "pull_request", "--labels", "run-ci-train,run-ci-all-entries",
                           "--paths", "pkg/io.py"), "label run-ci-all-entries"),
                         (("--event", "workflow_dispatch"), "every entry on workflow_dispatch")):
        job = next(j for j in json.loads(plan(planned, *args, "--json")) if j["job"] == "train")
        assert job["selected"] == "2 of 2 entries"
        assert {e["reason"] for e in job["entries"]} == {reason}


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
