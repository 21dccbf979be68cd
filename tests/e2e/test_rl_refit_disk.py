"""E2E: weight refit from disk to two engines on their own GPUs (two more GPUs train).

After every step rank 0 writes the policy as an HF directory (`weights/version_N`) and each
engine loads it with `/update_weights_from_disk`. Passing means: every engine reports version
N + 1 after step N, the run's --ci-test found the engines' log-probs equal to the trainer's
at every step (so they really serve the new weights), and only the last two versions are kept.
"""

import sys

import _rl

NUM_GPUS = 4
ROLLOUTS = 4


def prepare() -> None:
    _rl.prepare()


def execute():
    return _rl.train("refit_disk", NUM_GPUS, [
        "--rollout-num-gpus", "2", "--ci-test", "--refit-from", "disk", "--advantage-estimator", "grpo",
        "--rollout-batch-size", "16", "--n-samples-per-prompt", "4", "--num-rollout", str(ROLLOUTS),
        "--lr", "5e-4",
    ])


def check(run_dir) -> None:
    rows = _rl.metrics(run_dir)
    assert len(rows) == ROLLOUTS
    for r in rows:
        versions = r["refit/engine_versions"]
        assert len(versions) == 2 and set(versions.values()) == {str(r["step"] + 1)}, versions
        assert r["rollout/weight_version"] == r["step"]
        assert r["check/logprob_abs_diff_max"] <= 1e-3
    kept = sorted(p.name for p in (run_dir / "weights").iterdir())
    assert kept == [f"version_{ROLLOUTS - 1}", f"version_{ROLLOUTS}"], kept
    assert (run_dir / "weights" / f"version_{ROLLOUTS}" / "config.json").is_file()
    print(f"refit from disk ok: versions {[r['refit/version'] for r in rows]} on every engine", flush=True)


if __name__ == "__main__":
    prepare()
    check(execute())
    sys.exit(0)
