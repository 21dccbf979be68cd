"""E2E: PPO with a critic (value head, GAE, whitened advantages) on one colocated GPU, --ci-test on.

Passing means: the critic's value loss of the last steps is below that of the first steps by
`VALUE_DROP` (relative), and the rollout reward of the last steps beats the first by `MARGIN`.
"""

import sys

import _rl

NUM_GPUS = 1
ROLLOUTS = 30
WINDOW = 5
MARGIN = 0.05
VALUE_DROP = 0.25  # last window's value loss at most 75 % of the first window's


def prepare() -> None:
    _rl.prepare()


TRAIN_ARGS = (
    "--colocate", "--ci-test", "--advantage-estimator", "ppo", "--use-critic",
    "--rollout-batch-size", "32", "--n-samples-per-prompt", "4", "--num-rollout", "30",
    "--lr", "8e-4", "--critic-lr", "3e-3", "--kl-coef", "0.01", "--gamma", "1.0", "--lam", "0.95",
    "--ci-paired-eval-samples", "8",
)


def execute():
    return _rl.train("ppo", NUM_GPUS, list(TRAIN_ARGS))


def check(run_dir) -> None:
    rows = _rl.metrics(run_dir)
    assert len(rows) == ROLLOUTS, f"{len(rows)} steps, expected {ROLLOUTS}"
    values = [r["train/value_loss"] for r in rows]
    v_first, v_last = _rl.mean(values[:WINDOW]), _rl.mean(values[-WINDOW:])
    assert v_last <= (1 - VALUE_DROP) * v_first, f"value loss {v_first:.4f} -> {v_last:.4f} did not fall enough"
    first, last = _rl.reward_gain(rows, WINDOW)
    assert last >= first + MARGIN, f"reward {first:.3f} -> {last:.3f}: gained less than {MARGIN}"
    print(f"ppo critic ok: value loss {v_first:.4f} -> {v_last:.4f}, reward {first:.3f} -> {last:.3f}", flush=True)


if __name__ == "__main__":
    prepare()
    check(execute())
    sys.exit(0)
