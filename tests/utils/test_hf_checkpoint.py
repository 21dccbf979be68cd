"""HF checkpoint saver: sharded safetensors with an index, shard size honoured, reload equal."""

import json
import sys

import pytest
import torch
from safetensors import safe_open

from slime.utils.hf_checkpoint import (
    INDEX_NAME,
    load_hf_checkpoint,
    parse_size,
    plan_shards,
    save_hf_checkpoint,
)

NUM_GPUS = 0


def _state():
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(64, 16, generator=g),  # 4096 B
        "model.layers.0.attn.q.weight": torch.randn(16, 16, generator=g),  # 1024 B
        "model.layers.0.attn.k.weight": torch.randn(16, 16, generator=g).to(torch.bfloat16),  # 512 B
        "model.layers.0.mlp.up.weight": torch.randn(32, 16, generator=g),  # 2048 B
        "model.norm.weight": torch.ones(16),  # 64 B
        "lm_head.weight": torch.randn(64, 16, generator=g),  # 4096 B
    }


def test_round_trip_is_exact(tmp_path):
    state = _state()
    save_hf_checkpoint(state, tmp_path, max_shard_size=5000)
    back = load_hf_checkpoint(tmp_path)
    assert back.keys() == state.keys()
    for k, v in state.items():
        assert back[k].dtype == v.dtype
        assert torch.equal(back[k], v)


def test_index_maps_every_tensor_to_an_existing_shard(tmp_path):
    state = _state()
    save_hf_checkpoint(state, tmp_path, max_shard_size=5000)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert set(index["weight_map"]) == set(state)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in state.values())
    for name, filename in index["weight_map"].items():
        with safe_open(str(tmp_path / filename), framework="pt") as f:
            assert name in set(f.keys())


@pytest.mark.parametrize("limit", [1000, 5000, 6000, 100_000])
def test_shards_respect_the_size_limit(tmp_path, limit):
    state = _state()
    save_hf_checkpoint(state, tmp_path, max_shard_size=limit)
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            sizes = [f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys()]  # noqa: SIM118
        # Over the limit only when one tensor alone is larger than the limit.
        assert sum(sizes) <= limit or len(sizes) == 1
    n = len(shards)
    assert [s.name for s in shards] == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def test_big_limit_gives_one_shard_small_limit_many(tmp_path):
    save_hf_checkpoint(_state(), tmp_path / "one", max_shard_size="1MB")
    save_hf_checkpoint(_state(), tmp_path / "many", max_shard_size=1000)
    assert len(list((tmp_path / "one").glob("*.safetensors"))) == 1
    assert len(list((tmp_path / "many").glob("*.safetensors"))) == 6


def test_tied_and_non_contiguous_tensors_are_saved(tmp_path):
    w = torch.randn(8, 4)
    state = {"embed.weight": w, "lm_head.weight": w, "t.weight": torch.randn(4, 8).t()}
    save_hf_checkpoint(state, tmp_path)
    back = load_hf_checkpoint(tmp_path)
    assert torch.equal(back["lm_head.weight"], w)
    assert torch.equal(back["t.weight"], state["t.weight"])


def test_plan_shards_keeps_order():
    state = _state()
    plan = plan_shards(state, 5000)
    assert [n for shard in plan for n in shard] == list(state)


@pytest.mark.parametrize(("text", "value"), [("5GB", 5 * 10**9), ("512MiB", 512 * 2**20), ("100", 100), (" 1.5 kb ", 1500)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "five", "0", "-1GB", "3TB"])
def test_bad_sizes(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_empty_state_and_missing_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        save_hf_checkpoint({}, tmp_path)
    with pytest.raises(FileNotFoundError, match="neither"):
        load_hf_checkpoint(tmp_path)


def test_index_naming_a_missing_tensor_is_detected(tmp_path):
    save_hf_checkpoint(_state(), tmp_path, max_shard_size=5000)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    index["weight_map"]["ghost.weight"] = next(iter(index["weight_map"].values()))
    (tmp_path / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"ghost\.weight"):
        load_hf_checkpoint(tmp_path)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
