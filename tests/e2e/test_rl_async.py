"""E2E: fully asynchronous training, two trainer GPUs and two rollout GPUs.

Rollout k + 1 is generated while the trainer steps on rollout k, so every step after the
first trains on samples one weight version old (importance-corrected with --use-tis).
Passing means: the lag recorded for each step is 0 at step 0 (nothing to be behind yet) and
exactly 1 after; generation and training overlapped in time; and the off-policy gap is real
(the engine's log-probs differ from the trainer's once weights moved).
"""

import sys

import _rl

NUM_GPUS = 4
ROLLOUTS = 5


def prepare() -> None:
    _rl.prepare()


def execute():
    return _rl.train("async", NUM_GPUS, [
        "--rollout-num-gpus", "2", "--ci-test", "--use-tis", "--advantage-estimator", "grpo",
        "--rollout-batch-size", "16", "--n-samples-per-prompt", "4", "--num-rollout", str(ROLLOUTS),
        "--lr", "5e-4",
    ], script="train_async.py")


def check(run_dir) -> None:
    rows = _rl.metrics(run_dir)
    assert len(rows) == ROLLOUTS
    lags = [r["lag"] for r in rows]
    assert lags == [0] + [1] * (ROLLOUTS - 1), f"off-policy lag per step {lags}"
    for r in rows[1:]:
        assert r["rollout/weight_version"] == r["step"] - 1, (r["step"], r["rollout/weight_version"])
        assert r["check/logprob_abs_diff_max"] > 1e-4, f"step {r['step']}: rollout looks on-policy"
    overlaps = [r["async/overlap_seconds"] for r in rows[:-1]]
    assert all(o > 0 for o in overlaps), f"generation and training never overlapped: {overlaps}"
    print(f"async ok: lags {lags}, overlap {[round(o, 2) for o in overlaps]} s", flush=True)


if __name__ == "__main__":
    prepare()
    check(execute())
    sys.exit(0)
