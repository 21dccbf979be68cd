"""E2E: PPO with a critic (value head, GAE, whitened advantages) on one colocated GPU, --ci-test on.

Passing means: the critic's value loss of the last steps is at most `_learning.PPO_VALUE`'s
bound times that of the first steps, and the trained policy beats the untrained one on the
same prompts and sampling seeds by `_learning.PPO_GAIN` (`--ci-paired-eval-samples`). Both
bounds come from `benchmarks/learning.py` (seeds × CPU capabilities × planted breaks).

    python tests/e2e/test_rl_ppo_critic.py [--cpu-capability default|avx2|avx512]
"""

import sys

import _learning
import _rl

NUM_GPUS = 1
TRAIN_ARGS = (
    "--colocate", "--ci-test", "--advantage-estimator", "ppo", "--use-critic",
    "--rollout-batch-size", "32", "--n-samples-per-prompt", "4", "--num-rollout", "30",
    "--lr", "8e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2", "--min-lr", "8e-5",
    "--weight-decay", "0.01", "--critic-lr", "3e-3", "--kl-coef", "0.01", "--gamma", "1.0", "--lam", "0.95",
    "--ci-paired-eval-samples", "8",
)
ROLLOUTS = int(TRAIN_ARGS[TRAIN_ARGS.index("--num-rollout") + 1])


def prepare() -> None:
    _rl.prepare()


def execute():
    return _rl.train("ppo", NUM_GPUS, list(TRAIN_ARGS))


def check(run_dir) -> None:
    rows = _rl.metrics(run_dir)
    assert len(rows) == ROLLOUTS, f"{len(rows)} steps, expected {ROLLOUTS}"
    paired = _rl.paired(run_dir)
    seen = (f"value loss last/first {_learning.value_loss_ratio(rows, paired):.3f}, paired reward "
            f"{paired['paired/before']:.3f} -> {paired['paired/after']:.3f} "
            f"(gain {paired['paired/gain']:+.3f} ± {paired['paired/stderr']:.3f})")
    problems = _learning.failures((_learning.PPO_VALUE, _learning.PPO_GAIN), rows, paired)
    assert not problems, f"PPO did not learn: {'; '.join(problems)} ({seen})"
    print(f"ppo critic ok: {seen}", flush=True)


if __name__ == "__main__":
    _rl.pin_cpu_capability(sys.argv[1:])
    prepare()
    check(execute())
    sys.exit(0)
