"""`run --record-executed`: a real emulated run records what each entry executed, children included.

Two entries of a GPU suite run on emulated GPUs in a scratch checkout holding a copy of
slime/: one saves and loads a checkpoint through slime's FSDP checkpointer, the other only
asks it for the latest step and starts torchrun, whose two ranks run a function that the
entry's own process never calls. The records must hold what each process ran and nothing
the entry did not run; selection is then made from those records (tests/toolkit/select).
"""

import json
import shutil
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


def recorded(root: Path) -> dict:
    """Run the suite with --record-executed; the records it stored, by entry."""
    proc = run_ci("run", "--suite", "train", "--root", str(root), "--emulate-gpus", "--gpus", "2",
                  "--record-executed", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "executed code: 2 entries recorded" in proc.stdout
    return json.loads((root / RECORDS).read_text())["entries"]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return recorded(checkout_with_slime(tmp_path_factory.mktemp("record")))


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


QUICK = """
    NUM_GPUS = 1

    def execute():
        print("ran")

    if __name__ == "__main__":
        execute()
"""


def test_without_the_flag_nothing_is_recorded(tmp_path):
    root = write(tmp_path, {"ci/registry/repo_suites.py": REGISTRY, "tests/e2e/test_loads.py": QUICK,
                            "tests/e2e/test_ranks.py": QUICK})
    proc = run_ci("run", "--suite", "train", "--root", str(root), "--emulate-gpus", "--gpus", "2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "executed code" not in proc.stdout
    assert not (root / RECORDS).exists()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
