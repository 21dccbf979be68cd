"""Model arguments must agree with the HF checkpoint's config.json."""

import json
import sys

import pytest

from slime.utils.arguments import ArgumentsError, parse_args, read_hf_config

NUM_GPUS = 0

BASE = ["--rollout-batch-size", "8", "--actor-num-gpus-per-node", "1"]
DENSE = {
    "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "intermediate_size": 3072, "vocab_size": 151936,
}
MOE = {**DENSE, "num_experts": 128, "moe_intermediate_size": 768, "num_experts_per_tok": 8}
MODEL_ARGS = [
    "--hidden-size", "1024", "--num-layers", "28", "--num-attention-heads", "16",
    "--num-query-groups", "8", "--ffn-hidden-size", "3072", "--vocab-size", "151936",
]


def _ckpt(tmp_path, config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return ["--hf-checkpoint", str(tmp_path)]


def test_matching_dense_config(tmp_path):
    parse_args([*BASE, *_ckpt(tmp_path, DENSE), *MODEL_ARGS])


@pytest.mark.parametrize(
    ("flag", "value", "key"),
    [
        ("--hidden-size", "2048", "hidden_size 1024"),
        ("--num-layers", "24", "num_hidden_layers 28"),
        ("--num-attention-heads", "32", "num_attention_heads 16"),
        ("--num-query-groups", "4", "num_key_value_heads 8"),
        ("--ffn-hidden-size", "4096", "intermediate_size 3072"),
    ],
)
def test_each_mismatch_is_named(tmp_path, flag, value, key):
    args = list(MODEL_ARGS)
    args[args.index(flag) + 1] = value
    with pytest.raises(ArgumentsError, match=f"{flag} {value} vs {key}"):
        parse_args([*BASE, *_ckpt(tmp_path, DENSE), *args])


def test_padded_vocab_may_be_larger_not_smaller(tmp_path):
    ckpt = _ckpt(tmp_path, DENSE)
    parse_args([*BASE, *ckpt, "--vocab-size", "152064"])
    with pytest.raises(ArgumentsError, match="smaller than vocab_size 151936"):
        parse_args([*BASE, *ckpt, "--vocab-size", "151000"])


def test_moe_sizes(tmp_path):
    ckpt = _ckpt(tmp_path, MOE)
    moe = ["--num-experts", "128", "--moe-ffn-hidden-size", "768", "--moe-router-topk", "8"]
    parse_args([*BASE, *ckpt, *moe])
    bad = ["--num-experts", "64", "--moe-ffn-hidden-size", "512", "--moe-router-topk", "8"]
    with pytest.raises(ArgumentsError) as err:
        parse_args([*BASE, *ckpt, *bad])
    assert "--num-experts 64 vs num_experts 128" in str(err.value)
    assert "--moe-ffn-hidden-size 512 vs moe_intermediate_size 768" in str(err.value)


@pytest.mark.parametrize("key", ["num_local_experts", "n_routed_experts"])
def test_expert_count_under_other_names(tmp_path, key):
    config = {**DENSE, key: 64}
    with pytest.raises(ArgumentsError, match="--num-experts 32 vs num_experts 64"):
        parse_args([*BASE, *_ckpt(tmp_path, config), "--num-experts", "32"])


def test_multimodal_text_config_is_used(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": DENSE, "vision_config": {"hidden_size": 1}}))
    assert read_hf_config(tmp_path)["hidden_size"] == 1024


def test_missing_and_broken_config(tmp_path):
    with pytest.raises(ArgumentsError, match=r"no config\.json"):
        parse_args([*BASE, "--hf-checkpoint", str(tmp_path)])
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ArgumentsError, match="not valid JSON"):
        parse_args([*BASE, "--hf-checkpoint", str(tmp_path)])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
