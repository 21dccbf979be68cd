"""E2E: every parallel layout of the trainer gives the same gradients on the same recorded rollouts.

Colocated engines record two rollouts (`--debug-rollout-only --save-debug-rollout-data`).
A one-rank run replays them and records each step's grad norm and loss
(`--ci-save-grad-norm`), per-token (`--calculate-per-token-loss`) and per-sample. Then the
same rollouts replay with `--ci-load-grad-norm` on other layouts, each of which must stay
within 1 % on grad norm and 1e-4 relative on loss at every step (the run stops otherwise):

    DP2 (FSDP2)                 per-token
    DP4 (FSDP2)                 per-sample
    TP2 (DTensor TP)            per-token
    DP2 × TP2                   per-sample
    1 rank, 8+ micro-batches    per-token  (--max-tokens-per-gpu 64)

Finally the micro-batch layout with `--ci-wrong-normalisation` (each micro-batch its own
token mean, summed) must be stopped by the comparison: proof that it can fail.
"""

import os
import sys

import _rl

NUM_GPUS = 8
ROLLOUTS = 2
COMMON = ["--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--lr", "1e-3", "--seed", "5"]
LAYOUTS = {  # name: (GPUs, tensor parallel, loss mode, extra flags)
    "dp2": (2, 1, "per_token", ()),
    "dp4": (4, 1, "per_sample", ()),
    "tp2": (2, 2, "per_token", ()),
    "dp2xtp2": (4, 2, "per_sample", ()),
    "micro_batches": (1, 1, "per_token", ("--max-tokens-per-gpu", "64")),
}


def prepare() -> None:
    _rl.prepare()


def _dir(name):
    import slime.utils.external_utils.command_utils as U

    return U.output_dir() / name


def _replay(name, gpus, tp, mode, *flags):
    dumps = str(_dir("dumps") / "rollout_{rollout_id}.pt")
    loss = ["--calculate-per-token-loss"] if mode == "per_token" else []
    return _rl.train(name, gpus, [*COMMON, "--load-debug-rollout-data", dumps, "--num-rollout", str(ROLLOUTS),
                                  "--tensor-model-parallel-size", str(tp), *loss, *flags])


def execute():
    import slime.utils.external_utils.command_utils as U
    from slime.utils.external_utils.ray_head import private_head

    dumps = str(_dir("dumps") / "rollout_{rollout_id}.pt")
    results = {}
    with private_head(num_gpus=NUM_GPUS, env=os.environ) as head:
        os.environ["SLIME_SCRIPT_EXTERNAL_RAY"] = head.address
        try:
            _rl.train("record", 2, [*COMMON, "--colocate", "--debug-rollout-only", "--num-rollout", str(ROLLOUTS),
                                    "--save-debug-rollout-data", dumps])
            for mode in ("per_token", "per_sample"):
                _replay(f"reference_{mode}", 1, 1, mode, "--ci-save-grad-norm", str(_dir(f"ref_{mode}")))
            for name, (gpus, tp, mode, extra) in LAYOUTS.items():
                results[name] = _replay(name, gpus, tp, mode, "--ci-load-grad-norm", str(_dir(f"ref_{mode}")),
                                        *extra)
            try:
                _replay("wrong", 1, 1, "per_token", "--ci-load-grad-norm", str(_dir("ref_per_token")),
                        "--max-tokens-per-gpu", "64", "--ci-wrong-normalisation")
                results["wrong"] = None
            except U.TrainJobFailed as e:
                results["wrong"] = str(e)
        finally:
            os.environ.pop("SLIME_SCRIPT_EXTERNAL_RAY", None)
    return results


def check(results) -> None:
    from slime.backends.fsdp.grad_norm import read_records

    for mode in ("per_token", "per_sample"):
        ref = read_records(_dir(f"ref_{mode}"))
        assert sorted(ref) == list(range(ROLLOUTS)), f"reference {mode} steps {sorted(ref)}"
        assert all(r.grad_norm > 0 for r in ref.values()), f"reference {mode}: zero gradients prove nothing"
    for name in LAYOUTS:
        rows = _rl.metrics(results[name])
        assert len(rows) == ROLLOUTS, f"{name}: {len(rows)} steps"
    wrong = results["wrong"]
    assert wrong is not None, "the wrong normalisation was not caught by --ci-load-grad-norm"
    assert "grad-norm replay failed at step 0: grad norm" in wrong, wrong[-2000:]
    print(f"parallel check ok: {', '.join(LAYOUTS)} match the 1-rank reference; the wrong "
          "normalisation was caught", flush=True)


if __name__ == "__main__":
    prepare()
    check(execute())
    sys.exit(0)
