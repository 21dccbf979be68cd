"""E2E: fan-out (eight samples per prompt) with the dynamic sampling filter, on eight GPUs.

Four GPUs train (FSDP2 over four ranks), four serve rollouts. Groups whose eight rewards are
all equal are dropped before training. Passing means: every step reports how many groups and
samples the filter dropped, the counts add up to what was generated, something was dropped,
and every group that was trained on had mixed rewards (the trainer saw no zero-advantage group).
"""

import sys

import _rl

NUM_GPUS = 8
ROLLOUTS = 3
PROMPTS = 16
FAN_OUT = 8


def prepare() -> None:
    _rl.prepare()


def execute():
    return _rl.train("fanout", NUM_GPUS, [
        "--rollout-num-gpus", "4", "--ci-test", "--dynamic-sampling-filter",
        "--rollout-batch-size", str(PROMPTS), "--n-samples-per-prompt", str(FAN_OUT),
        "--num-rollout", str(ROLLOUTS), "--lr", "3e-4",
    ])


def check(run_dir) -> None:
    rows = _rl.metrics(run_dir)
    assert len(rows) == ROLLOUTS
    dropped_total = 0
    for r in rows:
        kept, dropped = r["filter/kept_groups"], r["filter/dropped_groups"]
        assert kept + dropped == PROMPTS, f"step {r['step']}: kept {kept} + dropped {dropped} != {PROMPTS}"
        assert r["filter/dropped_samples"] == dropped * FAN_OUT
        assert r["rollout/samples"] == (kept - r["rollout/trimmed_groups"]) * FAN_OUT
        assert r["train/samples"] == r["rollout/samples"]
        # Mixed groups only: a kept group's mean reward is strictly between 0 and 1, so the mean
        # over kept samples differs from the mean over all whenever something was dropped.
        assert 0 < r["rollout/reward"] < 1
        dropped_total += dropped
    assert dropped_total > 0, "the filter dropped nothing in any step (all groups mixed?)"
    print(f"fan-out ok: dropped {[r['filter/dropped_groups'] for r in rows]} of {PROMPTS} groups", flush=True)


if __name__ == "__main__":
    prepare()
    check(execute())
    sys.exit(0)
