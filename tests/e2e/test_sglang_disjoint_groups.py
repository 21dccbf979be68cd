"""E2E: `--sglang-config` with two engine groups on disjoint GPU sets, each with its own server arguments.

Four GPUs: the trainer takes the first, the rollout the other three. Group 0 is one engine on
rollout GPU 0 (max batch 8), group 1 two engines on rollout GPUs 1 and 2 (max batch 16).
Passing means, from what each engine reports of itself: the GPUs Ray gave group 0 and group 1
do not overlap and cover three GPUs, each engine runs with its group's overrides, every
engine served rollout requests and serves the trainer's version after every refit.
"""

import sys

import _rl

NUM_GPUS = 4
ROLLOUTS = 3
CONFIG = """\
sglang:
  - name: actor
    engine_groups:
      - num_gpus: 1
        overrides: {max_batch_size: 8}
      - num_gpus: 2
        overrides: {max_batch_size: 16}
"""


def prepare() -> None:
    _rl.prepare()


def execute():
    config = _rl.sglang_config("disjoint_groups", CONFIG)
    return _rl.train("sglang_disjoint_groups", NUM_GPUS, [
        "--rollout-num-gpus", "3", "--sglang-config", str(config), "--engine-start-timeout", "240",
        "--ci-test",
        "--advantage-estimator", "grpo", "--rollout-batch-size", "16", "--n-samples-per-prompt", "4",
        "--num-rollout", str(ROLLOUTS), "--lr", "5e-4",
    ])


def check(run_dir) -> None:
    started = _rl.engines(run_dir)
    by_group: dict[str, list[dict]] = {}
    for e in started:
        by_group.setdefault(e["name"].split("-")[1], []).append(e)
    assert sorted(by_group) == ["g0", "g1"] and [len(by_group[g]) for g in ("g0", "g1")] == [1, 2], (
        f"engines per group: { {g: [e['name'] for e in es] for g, es in by_group.items()} }")
    gpus = {g: {i for e in es for i in e["gpu_ids"]} for g, es in by_group.items()}
    assert not gpus["g0"] & gpus["g1"], f"the groups share GPUs: {gpus}"
    assert len(gpus["g0"] | gpus["g1"]) == 3, f"three rollout GPUs expected, engines report {gpus}"
    assert len({e["node_id"] for e in started}) == 1 and started[0]["node_id"], "engines' node ids missing"
    batch = {e["name"]: e["max_batch_size"] for e in started}
    assert batch == {"actor-g0-e0": 8, "actor-g1-e0": 16, "actor-g1-e1": 16}, f"overrides not applied: {batch}"
    rows = _rl.metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(ROLLOUTS))
    for r in rows:
        versions = r["refit/engine_versions"]
        assert len(versions) == 3 and set(versions.values()) == {str(r["step"] + 1)}, versions
    served = {e["name"]: e["requests_served"] for e in rows[-1]["engines"]}
    assert all(n > 0 for n in served.values()), f"an engine served no request: {served}"
    print(f"disjoint groups ok: GPUs {gpus}, batch sizes {batch}, served {served}", flush=True)


if __name__ == "__main__":
    prepare()
    check(execute())
    sys.exit(0)
