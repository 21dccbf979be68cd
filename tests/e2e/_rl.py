"""Shared steps of the RL e2e entries: publish the tiny model and data, train through U, read results.

`prepare()` builds the tiny arithmetic model (warmed up) and its data set and publishes both
into a Hugging Face hub cache under the entry's output dir; `train()` fetches them offline with
`U.hf_download_model` / `U.hf_download_dataset`, exactly as a real model is fetched, and runs
`train.py` (or `train_async.py`) as a Ray job through `U.execute_train`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import slime.utils.external_utils.command_utils as U

MODEL_REPO = "slime-ci/tiny-arith-qwen2"
DATASET_REPO = "slime-ci/tiny-arith"
QUIET = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TQDM_DISABLE": "1"}


def hub_env() -> dict[str, str]:
    """Offline hub, this entry's cache, model and data dirs."""
    out = U.output_dir()
    return {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(out / "hf_cache"),
            "SLIME_CI_MODELS_DIR": str(out / "models"), "SLIME_CI_DATASETS_DIR": str(out / "datasets")}


# huggingface_hub reads the offline switch and cache dir once, when first imported (transformers
# imports it too): set them before anything can import it.
os.environ.update(hub_env())


CAPABILITY_FLAG = "--cpu-capability"
CAPABILITIES = ("default", "avx2", "avx512")  # torch's CPU kernel sets, lowest first


def native_cpu_capability() -> str:
    """The kernel set torch picks on this CPU by itself (ATEN_CPU_CAPABILITY unset)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip().lower()


def pin_cpu_capability(argv: Sequence[str]) -> str | None:
    """`--cpu-capability X` among the entry's arguments: run everything under ATEN_CPU_CAPABILITY=X.

    torch reads the variable once, when first imported, to pick its CPU vector kernels: float
    rounding differs between them, so a learning check must hold under each. Set here, before
    anything imports torch, it reaches the warm-up in `prepare()` and, through the private Ray
    head this process starts, every engine and trainer rank. On CUDA it changes only CPU ops.
    """
    if CAPABILITY_FLAG not in argv:
        return _calibrated_on_emulated_gpus()
    at = list(argv).index(CAPABILITY_FLAG)
    wanted = argv[at + 1].lower() if at + 1 < len(argv) else ""
    if wanted not in CAPABILITIES:
        raise SystemExit(f"{CAPABILITY_FLAG} takes one of {', '.join(CAPABILITIES)}, got {wanted!r}")
    native = native_cpu_capability()
    if native in CAPABILITIES and CAPABILITIES.index(wanted) > CAPABILITIES.index(native):
        # torch would not fall back: its kernels would die of an illegal instruction.
        raise SystemExit(f"{CAPABILITY_FLAG} {wanted}: this CPU offers up to {native}")
    os.environ["ATEN_CPU_CAPABILITY"] = wanted
    print(f"cpu capability: {wanted} (this CPU offers up to {native})", flush=True)
    return wanted


# The kernel sets the learning bounds of tests/e2e/_learning.py were measured on. Under
# AVX-512 kernels (an AMD EPYC with AVX-512, benchmarks/learning.py, seeds 1, 2 and 1234) healthy
# GRPO at the colocated entry's arguments gave paired gains +0.088, -0.015 and +0.036, and
# still -0.005 and +0.031 with 32 eval samples: no bound there separates learning from a
# stall, while default and AVX2 kernels on the same machine gave +0.069 to +0.121.
CALIBRATED = ("default", "avx2")


def _calibrated_on_emulated_gpus() -> str | None:
    """Without --cpu-capability, an entry on emulated GPUs whose CPU offers more than the
    calibrated kernel sets runs under the best calibrated one (AVX2 on an AVX-512 CPU): its
    learning check means what it was measured to mean. On real GPUs nothing changes."""
    if os.environ.get("SLIME_CI_EMULATE_GPUS") != "1" or "ATEN_CPU_CAPABILITY" in os.environ:
        return None
    if not cpu_offers_avx512():
        return None
    os.environ["ATEN_CPU_CAPABILITY"] = CALIBRATED[-1]
    print(f"cpu capability: {CALIBRATED[-1]} (this CPU offers up to avx512; the learning bounds "
          f"were measured on {' and '.join(CALIBRATED)})", flush=True)
    return CALIBRATED[-1]


# The flags torch requires before it picks its AVX-512 kernels (aten's cpu capability check).
AVX512_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})


def cpu_offers_avx512(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether torch would pick AVX-512 kernels here, read from the CPU flags: instant, where
    asking torch itself (`native_cpu_capability`) costs a process that imports it (5-9 s)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split()) >= AVX512_FLAGS
    except OSError:
        pass
    return False


def prepare() -> None:
    """Build, warm up and publish the tiny model and data set into the entry's hub cache."""
    from slime.model.prepare import prepare_tiny_assets

    assets = prepare_tiny_assets(hub_env()["HF_HUB_CACHE"], seed=0,
                                 model_repo=MODEL_REPO, dataset_repo=DATASET_REPO)
    print(f"tiny model warmed up: loss {assets.warmup_first_loss:.3f} -> {assets.warmup_last_loss:.3f}",
          flush=True)


def fetch() -> tuple[Path, Path]:
    """(model dir, data dir) through the offline hub download path."""
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        os.environ.pop(proxy, None)
    return U.hf_download_model(MODEL_REPO), U.hf_download_dataset(DATASET_REPO)


def train(run_name: str, num_gpus: int, args: Sequence[str], *, script: str = "train.py",
          timeout: float = 900) -> Path:
    """Run the loop as a Ray job; returns the run's output dir (metrics.jsonl, engines.json, …)."""
    model, data = fetch()
    run_dir = U.output_dir() / run_name
    argv = ["--hf-checkpoint", str(model), "--prompt-data", str(data / "train.jsonl"),
            "--rm-type", "arith", "--num-gpus", str(num_gpus), "--output-dir", str(run_dir),
            "--rollout-max-response-len", "4", "--rollout-shuffle", *args]
    U.execute_train(argv, num_gpus_per_node=num_gpus, train_script=script, timeout=timeout,
                    extra_env_vars=QUIET)
    return run_dir


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metrics, one dict per step."""
    path = run_dir / "metrics.jsonl"
    assert path.is_file(), f"{path} missing: the run wrote no metrics"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def paired(run_dir: Path) -> dict[str, Any]:
    """`paired.json`: the reward before and after training on the same prompts and seeds."""
    path = run_dir / "paired.json"
    assert path.is_file(), f"{path} missing: run with --ci-paired-eval-samples"
    return dict(json.loads(path.read_text()))


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def reward_gain(rows: Sequence[dict[str, Any]], window: int) -> tuple[float, float]:
    """Mean rollout reward of the first and of the last `window` steps."""
    rewards = [r["rollout/reward_all"] if "rollout/reward_all" in r else r["rollout/reward"] for r in rows]
    return mean(rewards[:window]), mean(rewards[-window:])


def sglang_config(name: str, text: str) -> Path:
    """Write an `--sglang-config` YAML into the entry's output dir; returns its path."""
    path = U.output_dir() / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def engines(run_dir: Path) -> list[dict[str, Any]]:
    """`engines.json`: what each engine reported when the run started (or after a restart)."""
    path = run_dir / "engines.json"
    assert path.is_file(), f"{path} missing: the run wrote no engine report"
    return list(json.loads(path.read_text())["info"])
