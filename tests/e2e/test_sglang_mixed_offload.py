"""E2E: mixed offload, an updatable actor engine that sleeps while the trainer steps and a frozen
reference engine that stays awake and is never refit (two GPUs, colocated).

Passing means, at every one of the `ROLLOUTS` sleep/wake cycles: while the trainer stepped,
the actor engine held 0 bytes and woke with all of them, and the reference engine held its
weights throughout; after every refit the actor engine serves the new version with new
weights, and the reference engine still reports version 0 and the SHA-256 of the checkpoint
it was started from, computed here from the files; its greedy evaluation is the same every
time.
"""

import sys

import _rl

NUM_GPUS = 2
ROLLOUTS = 4
CONFIG = """\
sglang:
  - name: actor
    offload: true
    engine_groups:
      - num_gpus: 1
  - name: ref
    update_weights: false
    offload: false
    engine_groups:
      - num_gpus: 1
"""


def prepare() -> None:
    _rl.prepare()


def execute():
    config = _rl.sglang_config("mixed_offload", CONFIG)
    return _rl.train("sglang_mixed_offload", NUM_GPUS, [
        "--colocate", "--sglang-config", str(config), "--engine-start-timeout", "240",
        "--ci-test", "--ci-sleep-check",
        "--advantage-estimator", "grpo", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
        "--num-rollout", str(ROLLOUTS), "--lr", "5e-4",
        "--eval-prompt-data", str(_rl.fetch()[1] / "eval.jsonl"), "--eval-interval", "1",
    ])


def checkpoint_digest() -> str:
    """The digest the engine reports, computed from the checkpoint files the run started from."""
    import torch
    from transformers import AutoModelForCausalLM

    from slime.backends.engine.engine import named_tensors, tensors_digest

    model = AutoModelForCausalLM.from_pretrained(str(_rl.fetch()[0]), dtype=torch.float32)
    return tensors_digest(named_tensors(model))


def check(run_dir) -> None:
    started = {e["name"]: e for e in _rl.engines(run_dir)}
    assert sorted(started) == ["actor-g0-e0", "ref-g0-e0"], sorted(started)
    assert started["actor-g0-e0"]["offload"] and not started["ref-g0-e0"]["offload"]
    expected = checkpoint_digest()
    assert started["ref-g0-e0"]["weights_digest"] == expected, "the reference engine did not start from the checkpoint"
    rows = _rl.metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(ROLLOUTS))
    actor_digests = [expected]
    evals = []
    for r in rows:
        step = r["step"]
        awake, during, resumed = r["sleep/bytes_awake"], r["sleep/bytes_during_train"], r["sleep/bytes_resumed"]
        # Engines in config order: the actor, then the reference.
        assert during[0] == 0 and awake[0] > 0, f"step {step}: actor engine held {during[0]} bytes while training"
        assert during[1] == awake[1] > 0, f"step {step}: the reference engine (offload: false) went to sleep: {during}"
        assert resumed == awake, f"step {step}: woke with {resumed} bytes, slept with {awake}"
        states = {e["name"]: e for e in r["engines"]}
        ref, actor = states["ref-g0-e0"], states["actor-g0-e0"]
        assert ref["weight_version"] == "0" and ref["weights_digest"] == expected, (
            f"step {step}: the frozen engine changed: version {ref['weight_version']}, "
            f"digest {ref['weights_digest'][:12] if ref['weights_digest'] else None}")
        assert actor["weight_version"] == str(step + 1), f"step {step}: actor at {actor['weight_version']}"
        assert actor["weights_digest"] not in actor_digests, f"step {step}: the actor engine's weights did not change"
        actor_digests.append(actor["weights_digest"])
        evals.append(r["eval/reward@ref"])
    assert len(set(evals)) == 1, f"greedy evaluation of the frozen engine changed: {evals}"
    print(f"mixed offload ok: {ROLLOUTS} sleep/wake cycles; reference {expected[:12]} unchanged, "
          f"reference eval {evals[0]:.3f} every time", flush=True)


if __name__ == "__main__":
    prepare()
    check(execute())
    sys.exit(0)
