"""E2E: GRPO, colocated (engines and trainer share both GPUs), with every --ci-test invariant checked.

The trainer and the engines run as Ray actors on one placement group of two bundles; engines
sleep while the trainer steps. Passing means: the run's invariants held at every step (the
job fails otherwise), every engine served the trainer's version after every refit, and the
trained policy beats the untrained one on the same prompts and sampling seeds by
`_learning.GRPO_GAIN` (`--ci-paired-eval-samples`; the bound comes from
`benchmarks/learning.py`, measured over seeds, CPU capabilities and planted breaks).

    python tests/e2e/test_rl_grpo_colocated.py [--cpu-capability default|avx2|avx512]
"""

import sys

import _learning
import _rl

NUM_GPUS = 2
TRAIN_ARGS = (
    "--colocate", "--ci-test", "--advantage-estimator", "grpo",
    "--rollout-batch-size", "32", "--n-samples-per-prompt", "4", "--num-rollout", "30",
    "--lr", "8e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2", "--min-lr", "8e-5",
    "--weight-decay", "0.01", "--use-kl-loss", "--kl-loss-coef", "0.001", "--kl-loss-type", "k3",
    "--eval-interval", "4", "--ci-paired-eval-samples", "8",
)
ROLLOUTS = int(TRAIN_ARGS[TRAIN_ARGS.index("--num-rollout") + 1])


def prepare() -> None:
    _rl.prepare()


def execute():
    return _rl.train("grpo", NUM_GPUS, [*TRAIN_ARGS, "--eval-prompt-data", str(_rl.fetch()[1] / "eval.jsonl")])


def check(run_dir) -> None:
    rows = _rl.metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(ROLLOUTS)), f"steps {[r['step'] for r in rows]}"
    for r in rows:
        versions = r["refit/engine_versions"]
        assert len(versions) == NUM_GPUS and set(versions.values()) == {str(r["step"] + 1)}, versions
        assert r["rollout/weight_version"] == r["step"], (r["step"], r["rollout/weight_version"])
    assert any("eval/reward" in r for r in rows), "no evaluation ran"
    paired = _rl.paired(run_dir)
    first, last = _rl.reward_gain(rows, 5)
    seen = (f"paired reward {paired['paired/before']:.3f} -> {paired['paired/after']:.3f} "
            f"(gain {paired['paired/gain']:+.3f} ± {paired['paired/stderr']:.3f}); "
            f"rollout reward {first:.3f} -> {last:.3f}")
    problems = _learning.failures((_learning.GRPO_GAIN,), rows, paired)
    assert not problems, f"GRPO did not learn: {'; '.join(problems)} ({seen})"
    print(f"grpo colocated ok: {seen}", flush=True)


if __name__ == "__main__":
    _rl.pin_cpu_capability(sys.argv[1:])
    prepare()
    check(execute())
    sys.exit(0)
