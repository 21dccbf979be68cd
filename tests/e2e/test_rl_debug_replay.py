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
    phase2 = _rl.train("phase2_train", NUM_GPUS, ["--load-debug-rollout-data", _dump_template(),
                                                  "--ci-test", "--lr", "1e-4", *common])
    return phase1, phase2


def _classes(run_dir):
    import json

    actors = json.loads((run_dir / "actors.json").read_text())
    assert actors and "error" not in actors[0], f"no actor table: {actors}"
    return [a["class_name"] for a in actors]


def check(dirs) -> None:
    import json

    phase1, phase2 = dirs
    c1, c2 = _classes(phase1), _classes(phase2)
    assert c1.count("EngineActor") == NUM_GPUS and "TrainRank" not in c1, f"phase 1 ran {c1}"
    assert "EngineActor" not in c2, f"phase 2 started an engine: {c2}"
    assert c2.count("TrainRank") == NUM_GPUS, f"phase 2 ran {c2}"
    assert json.loads((phase2 / "engines.json").read_text())["started"] == 0
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
