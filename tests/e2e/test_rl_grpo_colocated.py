"""E2E: GRPO, colocated (engines and trainer share both GPUs), with every --ci-test invariant checked.

The trainer and the engines run as Ray actors on one placement group of two bundles; engines
sleep while the trainer steps. Passing means: the run's invariants held at every step (the
job fails otherwise), every engine served the trainer's version after every refit, and the
reward of the last rollouts beats the first by `MARGIN`.
"""

import sys

import _rl

NUM_GPUS = 2
ROLLOUTS = 30
WINDOW = 5
MARGIN = 0.1  # mean reward of the last two rollouts over the first two


def prepare() -> None:
    _rl.prepare()


TRAIN_ARGS = (
    "--colocate", "--ci-test", "--advantage-estimator", "grpo",
    "--rollout-batch-size", "32", "--n-samples-per-prompt", "4", "--num-rollout", "30",
    "--lr", "8e-4", "--use-kl-loss", "--kl-loss-coef", "0.001", "--kl-loss-type", "k3",
    "--eval-interval", "4", "--ci-paired-eval-samples", "8",
)


def execute():
    return _rl.train("grpo", NUM_GPUS, [*TRAIN_ARGS, "--eval-prompt-data", str(_rl.fetch()[1] / "eval.jsonl")])


def check(run_dir) -> None:
    rows = _rl.metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(ROLLOUTS)), f"steps {[r['step'] for r in rows]}"
    for r in rows:
        versions = r["refit/engine_versions"]
        assert len(versions) == NUM_GPUS and set(versions.values()) == {str(r["step"] + 1)}, versions
        assert r["rollout/weight_version"] == r["step"], (r["step"], r["rollout/weight_version"])
    first, last = _rl.reward_gain(rows, WINDOW)
    assert last >= first + MARGIN, f"reward {first:.3f} -> {last:.3f}: gained less than {MARGIN}"
    assert any("eval/reward" in r for r in rows), "no evaluation ran"
    print(f"grpo colocated ok: reward {first:.3f} -> {last:.3f}", flush=True)


if __name__ == "__main__":
    prepare()
    check(execute())
    sys.exit(0)
