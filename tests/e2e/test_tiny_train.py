"""E2E: train a tiny causal LM for a few steps as a Ray job through `U.execute_train`.

The pattern every e2e entry follows: module constants, `prepare()` makes the model and
data available, `execute()` trains through `U`, and the `__main__` block runs them and
checks the outcome; the runner judges the file by its exit code. The loss must fall, on
CUDA when the runner says `SLIME_CI_DEVICE=cuda` and on the CPU otherwise, and the
checkpoint must load back into the model.
"""

import json
import os
import sys
from pathlib import Path

import slime.utils.external_utils.command_utils as U

MODEL_NAME = "tiny-gpt"
MODEL_TYPE = "tiny-gpt"
NUM_GPUS = 1
TRAIN_STEPS = 20


def _paths() -> dict[str, Path]:
    out = U.output_dir()
    return {
        "data": out / "data" / "tiny.jsonl",
        "ckpt": out / "checkpoints" / MODEL_NAME,
        "metrics": out / "metrics.json",
    }


def prepare() -> None:
    """Make the training data.

    Entries with real models call `U.hf_download_model(...)` and `U.hf_download_dataset(...)`
    here; the tiny model is built from its config and its data is generated, so this entry
    needs no hub.
    """
    from slime.tiny_train import write_dataset

    write_dataset(_paths()["data"], 256, MODEL_TYPE)


def execute() -> None:
    """Train on this entry's GPUs (or emulated ranks) through a Ray job."""
    paths = _paths()
    train_args = [
        "--data", str(paths["data"]),
        "--steps", str(TRAIN_STEPS),
        "--world-size", str(max(NUM_GPUS, 1)),
        "--device", U.device(),
        "--save", str(paths["ckpt"]),
        "--metrics", str(paths["metrics"]),
        "--ci-test",
    ]
    U.execute_train(
        train_args=train_args,
        num_gpus_per_node=NUM_GPUS,
        megatron_model_type=MODEL_TYPE,
        train_script="slime/tiny_train.py",
        timeout=900,
    )


def check() -> None:
    """The loss fell, on the expected device and rank count, and the checkpoint loads."""
    import torch
    from safetensors.torch import load_file

    from slime.tiny_train import MODEL_PRESETS, TinyLM, loss_fell

    paths = _paths()
    metrics = json.loads(paths["metrics"].read_text())
    losses = metrics["losses"]
    assert len(losses) == TRAIN_STEPS, f"expected {TRAIN_STEPS} steps, got {len(losses)}"
    assert loss_fell(losses), f"loss did not fall: {losses}"
    assert losses[-1] < losses[0] - 0.5, f"loss barely moved: {losses[0]:.3f} -> {losses[-1]:.3f}"
    assert metrics["device"] == U.device(), f"trained on {metrics['device']}, expected {U.device()}"
    assert metrics["world_size"] == max(NUM_GPUS, 1)
    model = TinyLM(MODEL_PRESETS[MODEL_TYPE])
    model.load_state_dict(load_file(str(paths["ckpt"] / "model.safetensors")))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    print(f"tiny train ok: loss {losses[0]:.3f} -> {losses[-1]:.3f} on {metrics['device']}", flush=True)


if __name__ == "__main__":
    prepare()
    for proxy_var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        os.environ.pop(proxy_var, None)
    execute()
    check()
    sys.exit(0)
