"""Training arguments: batch arithmetic, parallel sizes, debug paths, sampling."""

import sys

import pytest

from slime.utils.arguments import ArgumentsError, build_parser, parse_args

NUM_GPUS = 0

BASE = ["--rollout-batch-size", "32", "--n-samples-per-prompt", "8", "--actor-num-gpus-per-node", "8"]


def test_defaults_derive_global_batch_from_steps():
    args = parse_args([*BASE, "--num-steps-per-rollout", "4"])
    assert args.global_batch_size == 64
    assert args.dp_size == 8


def test_steps_derived_from_global_batch():
    args = parse_args([*BASE, "--global-batch-size", "128"])
    assert args.num_steps_per_rollout == 2


def test_one_step_when_neither_is_given():
    args = parse_args(BASE)
    assert (args.global_batch_size, args.num_steps_per_rollout) == (256, 1)


def test_inconsistent_batch_arithmetic_names_both_sides():
    with pytest.raises(ArgumentsError, match=r"256 must equal .* 192"):
        parse_args([*BASE, "--global-batch-size", "64", "--num-steps-per-rollout", "3"])


def test_global_batch_must_divide_the_rollout():
    with pytest.raises(ArgumentsError, match="not a multiple of --global-batch-size 96"):
        parse_args([*BASE, "--global-batch-size", "96"])


def test_steps_must_divide_the_rollout():
    with pytest.raises(ArgumentsError, match="do not split into 3 steps"):
        parse_args([*BASE, "--num-steps-per-rollout", "3"])


def test_global_batch_must_divide_over_dp_and_micro_batches():
    with pytest.raises(ArgumentsError, match="multiple of data-parallel size 8 x --micro-batch-size 3"):
        parse_args([*BASE, "--micro-batch-size", "3"])


def test_dynamic_batch_needs_a_token_budget():
    with pytest.raises(ArgumentsError, match="--max-tokens-per-gpu"):
        parse_args([*BASE, "--micro-batch-size", "3", "--use-dynamic-batch-size"])
    args = parse_args([*BASE, "--micro-batch-size", "3", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096"])
    assert args.max_tokens_per_gpu == 4096


def test_data_parallel_size_from_model_parallel_sizes():
    args = parse_args([*BASE, "--tensor-model-parallel-size", "2", "--context-parallel-size", "2"])
    assert args.dp_size == 2


def test_gpus_must_divide_into_model_replicas():
    with pytest.raises(ArgumentsError, match="do not divide"):
        parse_args([*BASE, "--tensor-model-parallel-size", "3"])


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--tensor-model-parallel-size", "4", "--num-attention-heads", "6"], "num-attention-heads 6 is not divisible"),
        (["--tensor-model-parallel-size", "4", "--num-query-groups", "2"], "num-query-groups 2 is not divisible"),
        (["--pipeline-model-parallel-size", "4", "--num-layers", "30"], "num-layers 30 is not divisible"),
        (["--expert-model-parallel-size", "4", "--num-experts", "6"], "num-experts 6 is not divisible"),
        (["--expert-model-parallel-size", "2"], "needs a MoE model"),
    ],
)
def test_parallel_sizes_divide_the_model(extra, match):
    with pytest.raises(ArgumentsError, match=match):
        parse_args([*BASE, *extra])


@pytest.mark.parametrize("temp", ["0", "-0.5", "nan"])
def test_temperature_must_be_positive(temp):
    with pytest.raises(ArgumentsError, match="temperature must be positive"):
        parse_args([*BASE, "--rollout-temperature", temp])


def test_dual_clip_bound():
    with pytest.raises(ArgumentsError, match=r"> 1\.0"):
        parse_args([*BASE, "--eps-clip-c", "1.0"])


def test_unknown_rm_type():
    with pytest.raises(ArgumentsError, match="pick one of"):
        parse_args([*BASE, "--rm-type", "mathh"])


def test_debug_paths_need_the_rollout_id_placeholder():
    with pytest.raises(ArgumentsError, match=r"\{rollout_id\}"):
        parse_args([*BASE, "--save-debug-rollout-data", "/tmp/rollout.pt"])


def test_debug_modes_exclude_each_other():
    with pytest.raises(ArgumentsError, match="exclude each other"):
        parse_args([*BASE, "--debug-rollout-only", "--debug-train-only"])


def test_loading_debug_data_checks_the_first_file(tmp_path):
    pattern = str(tmp_path / "rollout_{rollout_id}.pt")
    with pytest.raises(ArgumentsError, match=r"rollout_3\.pt does not exist"):
        parse_args([*BASE, "--load-debug-rollout-data", pattern, "--start-rollout-id", "3"])
    (tmp_path / "rollout_3.pt").write_bytes(b"x")
    args = parse_args([*BASE, "--load-debug-rollout-data", pattern, "--start-rollout-id", "3"])
    assert args.load_debug_rollout_data == pattern


def test_loading_debug_data_cannot_go_with_rollout_only(tmp_path):
    (tmp_path / "r_0.pt").write_bytes(b"x")
    with pytest.raises(ArgumentsError, match="cannot go with --debug-rollout-only"):
        parse_args([*BASE, "--load-debug-rollout-data", str(tmp_path / "r_{rollout_id}.pt"), "--debug-rollout-only"])


def test_rollout_batch_size_is_required(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([])
    assert "--rollout-batch-size" in capsys.readouterr().err


def test_help_lists_the_groups(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for group in ("batching", "model", "algorithm", "debug"):
        assert group in out


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
