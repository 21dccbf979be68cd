"""One call for an e2e entry's `prepare()`: build, warm up and publish the tiny model and data set."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from slime.model.arith_data import write_dataset
from slime.model.hub_cache import publish_to_hub_cache
from slime.model.tiny import build_tiny_model
from slime.model.warmup import warm_up

MODEL_REPO = "slime-ci/tiny-arith-qwen2"
DATASET_REPO = "slime-ci/tiny-arith"
# 200 steps put the sampled reward (temperature 1) near 0.4 on the train split: room both ways.
DEFAULT_WARMUP_STEPS = 200


@dataclass(frozen=True, kw_only=True)
class TinyAssets:
    """Where the published model and data set are, by repo id and by cache snapshot."""

    model_repo: str
    dataset_repo: str
    model_snapshot: Path
    dataset_snapshot: Path
    warmup_first_loss: float
    warmup_last_loss: float


def prepare_tiny_assets(cache_dir: str | Path, *, seed: int = 0, warmup_steps: int = DEFAULT_WARMUP_STEPS,
                        model_repo: str = MODEL_REPO, dataset_repo: str = DATASET_REPO) -> TinyAssets:
    """Build model + data (seeded), warm the model up on the train split, publish both into `cache_dir`.

    Afterwards, with `HF_HUB_OFFLINE=1 HF_HUB_CACHE=<cache_dir>`, `U.hf_download_model(model_repo)`
    and `U.hf_download_dataset(dataset_repo)` return directories holding the model
    (`config.json`, `model.safetensors`, tokenizer files) and `train.jsonl` / `eval.jsonl`.
    """
    with tempfile.TemporaryDirectory(prefix="slime-tiny-") as tmp:
        data_dir = write_dataset(Path(tmp) / "data", seed=seed)
        model_dir = build_tiny_model(Path(tmp) / "model", seed=seed)
        result = warm_up(model_dir, data_dir / "train.jsonl", steps=warmup_steps, seed=seed)
        model_snapshot = publish_to_hub_cache(model_dir, model_repo, repo_type="model", cache_dir=cache_dir)
        dataset_snapshot = publish_to_hub_cache(data_dir, dataset_repo, repo_type="dataset",
                                                cache_dir=cache_dir)
    return TinyAssets(model_repo=model_repo, dataset_repo=dataset_repo, model_snapshot=model_snapshot,
                      dataset_snapshot=dataset_snapshot, warmup_first_loss=result.first_loss,
                      warmup_last_loss=result.last_loss)
