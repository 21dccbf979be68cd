"""E2E: debug rollout-then-train. Phase 1 saves two rollouts with engines and no trainer;
phase 2 trains on the saved files with no engine process started.

What ran is read from the Ray cluster's own actor table (`actors.json`, written from
`ray.util.state.list_actors`), not from the loop's word: phase 1 ran engines and no trainer
rank, phase 2 trainer ranks and no engine. Phase 2 trained on exactly the saved rollouts.
"""

import sys

import _rl
import torch

NUM_GPUS = 2
ROLLOUTS = 2


def prepare() -> None:
    _rl.prepare()


def _dump_template():
    import slime.utils.external_utils.command_utils as U

    return str(U.output_dir() / "dumps" / "rollout_{rollout_id}.pt")


def execute():
    common = ["--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--num-rollout", str(ROLLOUTS)]
    phase1 = _rl.train("phase1_rollout", NUM_GPUS, ["--colocate", "--debug-rollout-only",
                                                    "--save-debug-rollout-data", _dump_template(), *common])
    try:
        phase2 = _rl.train("phase2_train", NUM_GPUS, ["--load-debug-rollout-data", _dump_template(),
                                                      "--ci-test", "--lr", "1e-4", *common])
    except Exception:
        # A replay that starts engines goes on to fail in its own way (it takes the saved
        # rollouts for on-policy ones, so step 1's log-prob check fires): the actor table
        # its shutdown wrote names the cause before the symptom.
        _no_engine(_phase2_dir())
        raise
    return phase1, phase2


def _phase2_dir():
    import slime.utils.external_utils.command_utils as U

    return U.output_dir() / "phase2_train"


def _classes(run_dir):
    import json

    actors = json.loads((run_dir / "actors.json").read_text())
    assert actors and "error" not in actors[0], f"no actor table: {actors}"
    return [a["class_name"] for a in actors]


def _no_engine(run_dir, *, complete: bool = False) -> None:
    """Phase 2 started no engine: none in the cluster's actor table, none in `engines.json`.
    A run that failed may lack either file; a complete run (`complete`) must have both."""
    import json

    if complete:
        for name in ("actors.json", "engines.json"):
            assert (run_dir / name).is_file(), f"{run_dir / name} missing: phase 2 wrote no {name}"
    if (run_dir / "actors.json").is_file():
        c2 = _classes(run_dir)
        assert "EngineActor" not in c2, f"phase 2 started an engine: {c2}"
    if (run_dir / "engines.json").is_file():
        started = json.loads((run_dir / "engines.json").read_text())["started"]
        assert started == 0, f"phase 2 started an engine: engines.json lists {started}"


def check(dirs) -> None:
    phase1, phase2 = dirs
    c1, c2 = _classes(phase1), _classes(phase2)
    assert c1.count("EngineActor") == NUM_GPUS and "TrainRank" not in c1, f"phase 1 ran {c1}"
    _no_engine(phase2, complete=True)
    assert c2.count("TrainRank") == NUM_GPUS, f"phase 2 ran {c2}"
    rows1, rows2 = _rl.metrics(phase1), _rl.metrics(phase2)
    assert len(rows1) == len(rows2) == ROLLOUTS
    for rid in range(ROLLOUTS):
        dump = torch.load(_dump_template().format(rollout_id=rid), weights_only=True)["batch"]
        assert rows2[rid]["rollout/samples"] == len(dump["tokens"]) == rows1[rid]["rollout/samples"]
        assert abs(rows2[rid]["rollout/reward"] - rows1[rid]["rollout/reward"]) < 1e-12
        assert rows2[rid]["train/samples"] == len(dump["tokens"])
    print(f"debug replay ok: phase 1 actors {sorted(set(c1))}, phase 2 actors {sorted(set(c2))}", flush=True)


if __name__ == "__main__":
    prepare()
    check(execute())
    sys.exit(0)
