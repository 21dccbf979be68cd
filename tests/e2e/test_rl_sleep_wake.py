"""E2E: sleep/wake of a colocated engine around every trainer step (one GPU shared).

While the trainer steps, the engine has released its weights (`/release_memory_occupation`):
its tensor bytes on the device are 0 (CUDA memory on a GPU, tensor bytes on the CPU), and they
come back in full on `/resume_memory_occupation`. Passing means: released and back at every
step, and the engine's generations for the same seeds are identical before sleep and after wake.
"""

import sys

import _rl

NUM_GPUS = 1
ROLLOUTS = 3


def prepare() -> None:
    _rl.prepare()


def execute():
    return _rl.train("sleep_wake", NUM_GPUS, [
        "--colocate", "--ci-test", "--ci-sleep-check", "--advantage-estimator", "grpo",
        "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--num-rollout", str(ROLLOUTS),
        "--lr", "5e-4",
    ])


def check(run_dir) -> None:
    rows = _rl.metrics(run_dir)
    assert len(rows) == ROLLOUTS
    for r in rows:
        awake, released = r["sleep/bytes_awake"], r["sleep/bytes_released"]
        during, resumed = r["sleep/bytes_during_train"], r["sleep/bytes_resumed"]
        assert all(b > 0 for b in awake), f"step {r['step']}: engine held no memory before sleep: {awake}"
        assert released == [0] * NUM_GPUS, f"step {r['step']}: released engine still holds {released} bytes"
        assert during == [0] * NUM_GPUS, f"step {r['step']}: engine held {during} bytes while training"
        assert resumed == awake, f"step {r['step']}: woke with {resumed} bytes, slept with {awake}"
        assert r["sleep/probe_before"] == r["sleep/probe_after"], (
            f"step {r['step']}: same seeds, different generations: "
            f"{r['sleep/probe_before']} vs {r['sleep/probe_after']}")
    print(f"sleep/wake ok: {rows[0]['sleep/bytes_awake']} bytes released and restored each step", flush=True)


if __name__ == "__main__":
    prepare()
    check(execute())
    sys.exit(0)
