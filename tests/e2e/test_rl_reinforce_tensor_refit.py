"""E2E: REINFORCE++ (KL-shaped returns, whitened over both ranks) with refit from tensors, colocated.

The weights travel to the engines through `/update_weights_from_tensor` instead of a directory.
Passing means: every engine reports the trainer's version after each step, the run's --ci-test
found rollout and trainer log-probs equal at every step, and no weight directory was written.
"""

import sys

import _rl

NUM_GPUS = 2
ROLLOUTS = 4


def prepare() -> None:
    _rl.prepare()


def execute():
    return _rl.train("reinforce_tensor", NUM_GPUS, [
        "--colocate", "--ci-test", "--refit-from", "tensor", "--advantage-estimator", "reinforce_plus_plus",
        "--kl-coef", "0.01", "--rollout-batch-size", "16", "--n-samples-per-prompt", "2",
        "--num-rollout", str(ROLLOUTS), "--lr", "5e-4",
    ])


def check(run_dir) -> None:
    rows = _rl.metrics(run_dir)
    assert len(rows) == ROLLOUTS
    for r in rows:
        versions = r["refit/engine_versions"]
        assert len(versions) == NUM_GPUS and set(versions.values()) == {str(r["step"] + 1)}, versions
        assert r["check/logprob_abs_diff_max"] <= 1e-3
        assert r["train/grad_norm"] > 0
    assert not (run_dir / "weights").exists(), "tensor refit wrote weight directories"
    print(f"reinforce++ / tensor refit ok: versions {[r['refit/version'] for r in rows]}", flush=True)


if __name__ == "__main__":
    prepare()
    check(execute())
    sys.exit(0)
