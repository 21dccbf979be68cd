"""The supervised warm-up: deterministic for a seed, and it leaves RL something to improve.

The default warm-up must put the sampled reward (temperature 1, exact-match `arith` reward)
strictly between 0 and 1, in the band the e2e entries rely on, starting from a model that
answers almost nothing.
"""

import sys

import pytest

from slime.model.arith_data import write_dataset
from slime.model.prepare import DEFAULT_WARMUP_STEPS, prepare_tiny_assets
from slime.model.tiny import build_tiny_model
from slime.model.warmup import measure_reward, warm_up

NUM_GPUS = 0


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data"), seed=0)


def test_warm_up_is_deterministic_for_a_seed(tmp_path, data):
    weights = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        model = build_tiny_model(tmp_path / name, seed=0)
        result = warm_up(model, data / "train.jsonl", steps=10, seed=seed)
        assert result.last_loss < result.first_loss
        weights.append((model / "model.safetensors").read_bytes())
    assert weights[0] == weights[1]
    assert weights[0] != weights[2]  # the seed picks the batches


def test_prepared_model_has_a_reward_strictly_between_0_and_1(tmp_path, data):
    # What an e2e entry's prepare() publishes: built, warmed up (default steps), in the hub cache.
    before = measure_reward(build_tiny_model(tmp_path / "m", seed=0), data / "train.jsonl", seed=0)
    assets = prepare_tiny_assets(tmp_path / "hub", seed=0)
    assert assets.model_snapshot.parent.parent.name == "models--slime-ci--tiny-arith-qwen2"
    assert sorted(p.name for p in assets.dataset_snapshot.iterdir()) == ["eval.jsonl", "train.jsonl"]
    train = assets.dataset_snapshot / "train.jsonl"
    assert train.read_text() == (data / "train.jsonl").read_text()  # same seed, same split
    after = measure_reward(assets.model_snapshot, train, seed=0)
    held_out = measure_reward(assets.model_snapshot, assets.dataset_snapshot / "eval.jsonl", seed=0)
    print(f"reward before {before:.3f}, after {after:.3f} (train), {held_out:.3f} (eval); "
          f"loss {assets.warmup_first_loss:.3f} -> {assets.warmup_last_loss:.3f} in {DEFAULT_WARMUP_STEPS} steps")
    assert before < 0.05
    assert 0.2 <= after <= 0.7
    assert 0.0 < held_out < 1.0


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
