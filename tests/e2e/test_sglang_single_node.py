"""E2E: `--sglang-config` on one node: a group of two engines and a placeholder that reserves a GPU.

Four GPUs: the trainer takes the first, the rollout the other three. The config gives two
one-GPU engines to the first two rollout GPUs and reserves the third with a placeholder.
Passing means: exactly two engines started, on bundles 1 and 2 and on two different GPUs as
Ray assigned them; nothing runs on the reserved bundle 3; both engines served rollout
requests and serve the trainer's version after every refit; the run's --ci-test invariants
held (the job fails otherwise).
"""

import json
import sys

import _rl

NUM_GPUS = 4
ROLLOUTS = 3
CONFIG = """\
sglang:
  - name: actor
    engine_groups:
      - worker_type: regular
        num_gpus: 2
      - worker_type: placeholder
        num_gpus: 1
"""


def prepare() -> None:
    _rl.prepare()


def execute():
    config = _rl.sglang_config("single_node", CONFIG)
    return _rl.train("sglang_single_node", NUM_GPUS, [
        "--rollout-num-gpus", "3", "--sglang-config", str(config), "--engine-start-timeout", "240",
        "--ci-test",
        "--advantage-estimator", "grpo", "--rollout-batch-size", "16", "--n-samples-per-prompt", "4",
        "--num-rollout", str(ROLLOUTS), "--lr", "5e-4",
    ])


def check(run_dir) -> None:
    started = _rl.engines(run_dir)
    names = sorted(e["name"] for e in started)
    assert names == ["actor-g0-e0", "actor-g0-e1"], f"engines started: {names}"
    bundles = sorted(b for e in started for b in e["bundles"])
    assert bundles == [1, 2], f"engines on bundles {bundles}; the placeholder's bundle 3 must stay empty"
    gpu_ids = [tuple(e["gpu_ids"]) for e in started]
    assert all(len(g) == 1 for g in gpu_ids) and len(set(gpu_ids)) == 2, f"Ray gave the engines {gpu_ids}"
    actors = json.loads((run_dir / "actors.json").read_text())
    engine_actors = [a for a in actors if a.get("class_name") in ("EngineActor", "SGLangActor")]
    assert len(engine_actors) == 2, f"the cluster ran {len(engine_actors)} engine actors: {engine_actors}"
    rows = _rl.metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(ROLLOUTS))
    for r in rows:
        versions = r["refit/engine_versions"]
        assert len(versions) == 2 and set(versions.values()) == {str(r["step"] + 1)}, versions
    served = {e["name"]: e["requests_served"] for e in rows[-1]["engines"]}
    assert all(n > 0 for n in served.values()), f"an engine served no request: {served}"
    print(f"single-node layout ok: engines on bundles {bundles}, GPUs {gpu_ids}, served {served}", flush=True)


if __name__ == "__main__":
    prepare()
    check(execute())
    sys.exit(0)
