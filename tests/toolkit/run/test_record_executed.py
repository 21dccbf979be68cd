"""`run --record-executed`: a real emulated run records what each entry executed, children included.

Two entries of a GPU suite run on emulated GPUs in a scratch checkout holding a copy of
slime/: one saves and loads a checkpoint through slime's FSDP checkpointer, the other only
asks it for the latest step and starts torchrun, whose two ranks run a function that the
entry's own process never calls. The records must hold what each process ran and nothing
the entry did not run; selection is then made from those records (tests/toolkit/select).
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, run_ci, write

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", label="run-ci-train",
              image="example/train:1", timeout=300, entries=(
            Entry(path="tests/e2e/test_loads.py"),
            Entry(path="tests/e2e/test_ranks.py"),
        )),
    )
"""

LOADS = """
    import os, sys
    import torch
    from slime.backends.fsdp import checkpoint as ck
    NUM_GPUS = 1

    def execute():
        root = os.path.join(os.environ["SLIME_CI_OUTPUT_DIR"], "ckpt")
        model = torch.nn.Linear(4, 2)
        saver = ck.Checkpointer(root, save_optimizer=None)
        saver.save(ck.TrainState(step=1), model)
        saver.close()
        state = ck.load(root, torch.nn.Linear(4, 2), load_optimizer=None, load_rng=False)
        assert state is not None and state.step == 1, state

    if __name__ == "__main__":
        execute()
"""

RANKS = """
    import os, subprocess, sys
    from slime.backends.fsdp import checkpoint as ck
    NUM_GPUS = 1

    def execute():
        assert ck.latest_step(os.environ["SLIME_CI_OUTPUT_DIR"]) is None
        here = os.path.dirname(os.path.abspath(__file__))
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-port", os.environ.get("SLIME_CI_PORT_BASE", "29511"),
                        os.path.join(here, "_rank.py")], check=True)

    if __name__ == "__main__":
        execute()
"""

RANK = """
    import os

    def only_in_rank():
        return int(os.environ["RANK"]) * 2

    if __name__ == "__main__":
        assert only_in_rank() in (0, 2)
"""

RECORDS = Path(".ci-cache/executed/records.json")


def checkout_with_slime(tmp_path: Path) -> Path:
    """A scratch checkout with the real slime/ and the two entries; returns its root."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "slime", root / "slime", ignore=shutil.ignore_patterns("__pycache__"))
    return write(root, {"ci/registry/repo_suites.py": REGISTRY, "tests/e2e/test_loads.py": LOADS,
                        "tests/e2e/test_ranks.py": RANKS, "tests/e2e/_rank.py": RANK})


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def committed(root: Path) -> Path:
    """The checkout as a git repository on `main`, everything committed."""
    git(root, "init", "-q", "-b", "main")
    (root / ".gitignore").write_text(".ci-cache/\n__pycache__/\n")
    (root / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "base")
    return root


def recorded(root: Path) -> dict:
    """Run the suite with --record-executed; the records it stored, by entry."""
    proc = run_ci("run", "--suite", "train", "--root", str(root), "--emulate-gpus", "--gpus", "2",
                  "--record-executed", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "executed code: 2 entries recorded" in proc.stdout
    return json.loads((root / RECORDS).read_text())["entries"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = committed(checkout_with_slime(tmp_path_factory.mktemp("record")))
    recorded(root)
    return root


@pytest.fixture(scope="module")
def records(repo):
    return json.loads((repo / RECORDS).read_text())["entries"]


def plan_for(repo: Path, branch: str, edit) -> dict[str, tuple[bool, str]]:
    """Commit `edit` on a new branch off main; what `plan --diff main` picks, per entry."""
    git(repo, "checkout", "-q", "-b", branch, "main")
    try:
        edit(repo)
        git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-am", branch)
        proc = run_ci("plan", "--event", "pull_request", "--labels", "run-ci-train", "--diff", "main",
                      "--json", "--root", str(repo))
        assert proc.returncode == 0, proc.stderr
        job = next(j for j in json.loads(proc.stdout) if j["job"] == "train")
        return {e["entry"]: (e["runs"], e["reason"]) for e in job["entries"]}
    finally:
        git(repo, "checkout", "-q", "main")


def replace_in(rel: str, old: str, new: str):
    def edit(root: Path) -> None:
        path = root / rel
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))
    return edit


CK = "slime/backends/fsdp/checkpoint.py"
LOADS_ID, RANKS_ID = "tests/e2e/test_loads.py", "tests/e2e/test_ranks.py"


@pytest.mark.slow
def test_a_change_inside_the_loader_selects_only_the_entry_that_loads(repo):
    picked = plan_for(repo, "in-load", replace_in(
        CK, "    found = resolve_step(root, step)\n",
        "    found = resolve_step(root, step)  # changed\n    assert found != -1\n"))
    assert picked[LOADS_ID][0] and picked[LOADS_ID][1].startswith(f"executes {CK}:load lines ")
    assert picked[RANKS_ID] == (False, "executes none of the changed code")


def dry_runs_on(repo: Path, branch: str, edit, *argsets: tuple[str, ...]) -> list:
    """Commit `edit` on a new branch off main; `run --suite train --dry-run` there with each
    set of extra arguments."""
    git(repo, "checkout", "-q", "-b", branch, "main")
    try:
        edit(repo)
        git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-am", branch)
        return [run_ci("run", "--suite", "train", "--root", str(repo), "--emulate-gpus", "--gpus", "2",
                       *args, "--dry-run") for args in argsets]
    finally:
        git(repo, "checkout", "-q", "main")


@pytest.mark.slow
def test_run_by_executed_runs_only_the_entries_the_branch_reaches(repo):
    [proc] = dry_runs_on(repo, "run-in-load", replace_in(
        CK, "    found = resolve_step(root, step)\n", "    found = resolve_step(root, step)\n    assert found != -2\n"),
        ("--by-executed", "main"))
    assert proc.returncode == 0, proc.stderr
    assert "selection by executed code: 1 of 2 entries (against main)" in proc.stderr
    assert f"left out {RANKS_ID}: executes none of the changed code" in proc.stderr
    assert f"{LOADS_ID}  gpus=1" in proc.stdout and f"[executes {CK}:load lines " in proc.stdout
    assert f"{RANKS_ID}  gpus" not in proc.stdout


@pytest.mark.slow
def test_run_by_executed_reads_the_records_of_its_store(repo):
    # A GPU job of a PR has no records file: the restored snapshot of main's runs
    # (.ci-cache/history.sqlite, the run's own store) is what it selects from.
    aside = repo / ".ci-cache/records-aside-run.json"
    (repo / RECORDS).replace(aside)
    try:
        proc, off = dry_runs_on(repo, "run-from-store", replace_in(
            CK, "    found = resolve_step(root, step)\n",
            "    found = resolve_step(root, step)\n    assert found != -4\n"),
            ("--by-executed", "HEAD^"), ("--by-executed", "HEAD^", "--history", "off"))
    finally:
        aside.replace(repo / RECORDS)
    assert proc.returncode == 0, proc.stderr
    assert "selection by executed code: 1 of 2 entries (against HEAD^)" in proc.stderr
    assert f"left out {RANKS_ID}: executes none of the changed code" in proc.stderr
    # With neither the store nor the file, no entry has a record, and every entry runs.
    assert off.returncode == 0, off.stderr
    assert "selection by executed code: 2 of 2 entries (against HEAD^)" in off.stderr


@pytest.mark.slow
def test_a_recording_run_gives_each_entry_the_registry_s_longer_timeout(repo):
    # The suite's timeout is 300 s; SelectionPolicy.recording_timeout_factor (3) under recording,
    # and an explicit --timeout as given.
    plain, recording, explicit = (
        run_ci("run", "--suite", "train", "--root", str(repo), "--emulate-gpus", "--gpus", "2", *args,
               "--dry-run") for args in ((), ("--record-executed",), ("--record-executed", "--timeout", "42")))
    for proc in (plain, recording, explicit):
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{LOADS_ID}  gpus=1  timeout=300s" in plain.stdout
    assert f"{LOADS_ID}  gpus=1  timeout=900s" in recording.stdout
    assert f"{LOADS_ID}  gpus=1  timeout=42s" in explicit.stdout


NOT_SAVED = "    if not marker.exists():\n        return None\n"


@pytest.mark.slow
def test_a_branch_of_a_function_both_ran_selects_only_the_entry_that_took_it(repo, records):
    # Both entries ran latest_step: the loader found a step, test_ranks found none and took
    # the early return. The records keep the lines, so the branch decides.
    assert all("latest_step" in r["files"][CK] and CK in r["lines"] for r in records.values())
    picked = plan_for(repo, "branch", replace_in(CK, NOT_SAVED, NOT_SAVED.replace("return None", "return (None)")))
    assert picked[RANKS_ID][0] and picked[RANKS_ID][1].startswith(f"executes {CK}:latest_step lines ")
    assert picked[LOADS_ID] == (False, f"executes {CK}:latest_step but none of the changed blocks")


@pytest.mark.slow
def test_a_branch_neither_took_selects_none_and_a_comment_changes_nothing(repo):
    raising = replace_in(CK, "        raise CheckpointError(f\"{marker} holds", "        raise ValueError(f\"{marker} holds")
    commented = replace_in(CK, "    marker = Path(root) / LATEST\n", "    # where the last step is named\n"
                                                                    "    marker = Path(root) / LATEST\n")
    for branch, edit in (("raise", raising), ("comment", commented)):
        picked = plan_for(repo, branch, edit)
        assert picked == {LOADS_ID: (False, f"executes {CK}:latest_step but none of the changed blocks"),
                          RANKS_ID: (False, f"executes {CK}:latest_step but none of the changed blocks")}, branch


@pytest.mark.slow
def test_a_module_level_change_selects_both(repo):
    picked = plan_for(repo, "module-level", replace_in(CK, "\nclass CheckpointError", "\nLIMIT = 3\n\n\nclass CheckpointError"))
    assert picked == {LOADS_ID: (True, f"executes {CK} (module level changed)"),
                      RANKS_ID: (True, f"executes {CK} (module level changed)")}


@pytest.mark.slow
def test_a_pyproject_change_selects_all(repo):
    picked = plan_for(repo, "leak", replace_in("pyproject.toml", "scratch", "scratch2"))
    assert picked == {LOADS_ID: (True, "leak path pyproject.toml"),
                      RANKS_ID: (True, "leak path pyproject.toml")}


@pytest.mark.slow
def test_a_file_neither_executes_selects_none_and_says_so(repo, records):
    unrun = "slime/rollout/filter.py"
    assert all(unrun not in r["files"] for r in records.values())
    picked = plan_for(repo, "unrun", replace_in(unrun, "def ", "def _added():\n    return 1\n\n\ndef "))
    assert picked == {LOADS_ID: (False, "executes none of the changed code"),
                      RANKS_ID: (False, "executes none of the changed code")}


@pytest.mark.slow
def test_changing_the_rank_only_function_selects_the_entry_that_started_torchrun(repo):
    picked = plan_for(repo, "rank", replace_in("tests/e2e/_rank.py", "* 2", "* 2 + 0"))
    assert picked[LOADS_ID] == (False, "executes none of the changed code")
    assert picked[RANKS_ID][0] and picked[RANKS_ID][1].startswith("executes tests/e2e/_rank.py:only_in_rank lines ")


@pytest.mark.slow
def test_each_entry_records_the_functions_it_ran_and_no_others(records):
    loads = records["tests/e2e/test_loads.py"]["files"]
    ranks = records["tests/e2e/test_ranks.py"]["files"]
    ck = "slime/backends/fsdp/checkpoint.py"
    assert {"load", "Checkpointer.save", "Checkpointer.__init__", "<module>"} <= set(loads[ck])
    assert "load" not in ranks[ck] and "Checkpointer.save" not in ranks[ck]
    assert {"latest_step", "<module>"} <= set(ranks[ck])
    assert "execute" in loads["tests/e2e/test_loads.py"]
    assert "tests/e2e/test_ranks.py" not in loads


@pytest.mark.slow
def test_a_function_run_only_by_torchrun_ranks_is_recorded(records):
    ranks = records["tests/e2e/test_ranks.py"]
    assert ranks["files"]["tests/e2e/_rank.py"] == ["<module>", "only_in_rank"]
    assert "tests/e2e/_rank.py" not in records["tests/e2e/test_loads.py"]["files"]
    assert len(ranks["commit"]) in (7, 40) or ranks["commit"] == "unknown"


@pytest.mark.slow
def test_the_run_puts_each_record_in_its_history_and_the_plan_reads_it_from_there(repo, records):
    from ci.history.store import open_store

    url = f"sqlite:///{repo / '.ci-cache/history.sqlite'}"
    with open_store(url, create=False) as store:
        stored = store.executed()
    assert {e: {f: list(fns) for f, fns in r.files.items()} for e, r in stored.items()} == \
        {e: r["files"] for e, r in records.items()}
    assert {e: {f: spans for f, (_, spans) in r.lines.items()} for e, r in stored.items()} == \
        {e: r["lines"] for e, r in records.items()}
    assert {r.commit for r in stored.values()} == {git(repo, "rev-parse", "HEAD")}
    aside = repo / ".ci-cache/records-aside.json"
    (repo / RECORDS).replace(aside)  # the store alone must decide
    try:
        picked = plan_for(repo, "from-store", replace_in(
            CK, "    found = resolve_step(root, step)\n",
            "    found = resolve_step(root, step)  # changed\n    assert found != -3\n"))
    finally:
        aside.replace(repo / RECORDS)
    assert picked[LOADS_ID][0] and picked[LOADS_ID][1].startswith(f"executes {CK}:load lines ")
    assert picked[RANKS_ID] == (False, "executes none of the changed code")


QUICK = """
    NUM_GPUS = 1

    def execute():
        print("ran")

    if __name__ == "__main__":
        execute()
"""


@pytest.mark.slow
def test_without_the_flag_nothing_is_recorded(tmp_path):
    root = write(tmp_path, {"ci/registry/repo_suites.py": REGISTRY, "tests/e2e/test_loads.py": QUICK,
                            "tests/e2e/test_ranks.py": QUICK})
    proc = run_ci("run", "--suite", "train", "--root", str(root), "--emulate-gpus", "--gpus", "2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "executed code" not in proc.stdout
    assert not (root / RECORDS).exists()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
