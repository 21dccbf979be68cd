"""Command line of the trainer, and the checks that catch a bad run before it costs GPU hours."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class ArgumentsError(ValueError):
    """An inconsistent set of training arguments; the message says what to change."""


ADVANTAGE_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus", "ppo", "cispo")
KL_LOSS_TYPES = ("k1", "k2", "k3", "low_var_kl")


def build_parser() -> argparse.ArgumentParser:
    """The trainer's argument parser (no validation; see `validate_args`)."""
    p = argparse.ArgumentParser(prog="slime-train", description="RL post-training of a language model.")
    g = p.add_argument_group("cluster")
    g.add_argument("--actor-num-nodes", type=int, default=1)
    g.add_argument("--actor-num-gpus-per-node", type=int, default=8)
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--context-parallel-size", type=int, default=1)
    g.add_argument("--expert-model-parallel-size", type=int, default=1)

    g = p.add_argument_group("batching")
    g.add_argument("--rollout-batch-size", type=int, required=True, help="prompts per rollout")
    g.add_argument("--n-samples-per-prompt", type=int, default=1)
    g.add_argument("--global-batch-size", type=int, default=None, help="samples per optimizer step")
    g.add_argument("--num-steps-per-rollout", type=int, default=None)
    g.add_argument("--micro-batch-size", type=int, default=1)
    g.add_argument("--use-dynamic-batch-size", action="store_true")
    g.add_argument("--max-tokens-per-gpu", type=int, default=None)

    g = p.add_argument_group("model")
    g.add_argument("--hf-checkpoint", type=str, default=None, help="directory with config.json")
    g.add_argument("--hidden-size", type=int, default=None)
    g.add_argument("--num-layers", type=int, default=None)
    g.add_argument("--num-attention-heads", type=int, default=None)
    g.add_argument("--num-query-groups", type=int, default=None)
    g.add_argument("--ffn-hidden-size", type=int, default=None)
    g.add_argument("--vocab-size", type=int, default=None, help="padded vocabulary size")
    g.add_argument("--num-experts", type=int, default=None)
    g.add_argument("--moe-ffn-hidden-size", type=int, default=None)
    g.add_argument("--moe-router-topk", type=int, default=None)

    g = p.add_argument_group("algorithm")
    g.add_argument("--advantage-estimator", choices=ADVANTAGE_ESTIMATORS, default="grpo")
    g.add_argument("--kl-loss-type", choices=KL_LOSS_TYPES, default="low_var_kl")
    g.add_argument("--eps-clip", type=float, default=0.2)
    g.add_argument("--eps-clip-high", type=float, default=None)
    g.add_argument("--eps-clip-c", type=float, default=None, help="dual-clip bound, > 1")
    g.add_argument("--rollout-temperature", type=float, default=1.0)
    g.add_argument("--rollout-max-response-len", type=int, default=1024)
    g.add_argument("--rm-type", type=str, default=None)

    g = p.add_argument_group("plugins")
    g.add_argument("--rollout-function-path", default="slime.rollout.reference:generate_rollout")
    g.add_argument("--custom-generate-function-path", default=None)

    g = p.add_argument_group("debug")
    g.add_argument("--debug-rollout-only", action="store_true")
    g.add_argument("--debug-train-only", action="store_true")
    g.add_argument("--save-debug-rollout-data", default=None, help="path with {rollout_id}")
    g.add_argument("--load-debug-rollout-data", default=None, help="path with {rollout_id}")
    g.add_argument("--start-rollout-id", type=int, default=0)
    add_training_path_arguments(p)
    add_checkpoint_arguments(p)
    return p


def add_training_path_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `train.py` / `train_async.py`: the RL loop on Ray (placement, data, optimiser, checks)."""
    g = p.add_argument_group("placement")
    g.add_argument("--num-gpus", type=int, default=None,
                   help="GPUs of the placement group (default: NUM_GPUS from the environment)")
    g.add_argument("--colocate", action="store_true", help="engines and trainer share every GPU")
    g.add_argument("--rollout-num-gpus", type=int, default=None, help="GPUs for engines, not colocated")
    g.add_argument("--rollout-backend", choices=("slime", "sglang"), default="slime")
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1,
                   help="GPUs per engine (the default of --sglang-config groups)")
    g.add_argument("--sglang-config", default=None, metavar="FILE.yaml",
                   help="engine groups: models, GPUs, frozen or updatable, offload "
                        "(python -m slime.backends.engine.sglang_config FILE checks one)")
    g.add_argument("--engine-start-timeout", type=float, default=600.0,
                   help="seconds every engine gets to be placed and load its model")
    g.add_argument("--use-fault-tolerance", action="store_true",
                   help="restart an engine that dies and retry the requests it had")

    g = p.add_argument_group("data")
    g.add_argument("--prompt-data", default=None, help="JSONL file of prompts with labels")
    g.add_argument("--input-key", default="prompt")
    g.add_argument("--label-key", default="label")
    g.add_argument("--eval-prompt-data", default=None)
    g.add_argument("--eval-interval", type=int, default=None, help="evaluate every N rollouts")
    g.add_argument("--n-samples-per-eval-prompt", type=int, default=1)
    g.add_argument("--num-rollout", type=int, default=None, help="rollouts to train on")
    g.add_argument("--rollout-top-p", type=float, default=1.0)
    g.add_argument("--rollout-shuffle", action="store_true")
    g.add_argument("--dynamic-sampling-filter", action="store_true",
                   help="drop groups whose rewards are all equal")
    g.add_argument("--seed", type=int, default=1234)

    g = p.add_argument_group("optimiser")
    g.add_argument("--lr", type=float, default=1e-5)
    g.add_argument("--critic-lr", type=float, default=1e-4)
    g.add_argument("--weight-decay", type=float, default=0.0,
                   help="decoupled weight decay of every weight but biases and norm weights")
    # The lr schedule, with Megatron's names and meanings (slime.backends.fsdp.lr_schedule); an
    # iteration is one optimizer step, one per rollout here.
    g.add_argument("--lr-decay-style", choices=("constant", "linear", "cosine"), default="constant",
                   help="decay after the warm-up (default constant: the lr stays at --lr)")
    g.add_argument("--lr-warmup-iters", type=int, default=0, help="steps of linear warm-up")
    g.add_argument("--lr-warmup-fraction", type=float, default=None,
                   help="warm-up as a fraction of --lr-decay-iters (instead of --lr-warmup-iters)")
    g.add_argument("--lr-decay-iters", type=int, default=None,
                   help="steps to decay over (default --num-rollout); --min-lr after them")
    g.add_argument("--lr-warmup-init", type=float, default=0.0, help="lr at the start of the warm-up")
    g.add_argument("--min-lr", type=float, default=0.0, help="the lr the decay ends at")
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--use-kl-loss", action="store_true")
    g.add_argument("--kl-loss-coef", type=float, default=0.0)
    g.add_argument("--kl-coef", type=float, default=0.0, help="KL penalty in rewards (ppo, reinforce++)")
    g.add_argument("--entropy-coef", type=float, default=0.0)
    g.add_argument("--use-critic", action="store_true")
    g.add_argument("--gamma", type=float, default=1.0)
    g.add_argument("--lam", type=float, default=1.0)
    g.add_argument("--use-tis", action="store_true", help="truncated importance sampling (off-policy)")
    g.add_argument("--tis-clip", type=float, default=2.0)
    g.add_argument("--refit-from", choices=("disk", "tensor"), default="disk")

    g = p.add_argument_group("output and checks")
    g.add_argument("--output-dir", default=None, help="metrics.jsonl and weight versions go here")
    g.add_argument("--ci-test", action="store_true", help="check the run's invariants at every step")
    g.add_argument("--ci-logprob-tol", type=float, default=1e-3,
                   help="largest |rollout - trainer| log-prob allowed on one token")
    g.add_argument("--ci-ratio-band", type=float, default=1e-3,
                   help="on-policy importance ratios must stay within 1 ± this")
    g.add_argument("--ci-paired-eval-samples", type=int, default=0, metavar="K",
                   help="before the first step and after the last, sample K answers to every training "
                        "prompt with the same seeds; write the paired reward gain to paired.json")
    g.add_argument("--ci-sleep-check", action="store_true",
                   help="prove engines release memory while the trainer steps (colocated)")


def add_checkpoint_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of trainer checkpoints (torch.distributed.checkpoint) and of the precision replay."""
    g = p.add_argument_group("checkpoint")
    g.add_argument("--save", default=None, help="directory to save trainer checkpoints into")
    g.add_argument("--save-interval", type=int, default=None,
                   help="save every K rollouts (the last rollout is always saved)")
    g.add_argument("--load", default=None, help="resume from the latest complete checkpoint here")
    g.add_argument("--ckpt-step", type=int, default=None, help="with --load: this step, not the latest")
    g.add_argument("--save-optimizer", choices=("gpu", "cpu"), default="gpu",
                   help="stage optimizer state on the device or in CPU memory while saving")
    g.add_argument("--load-optimizer", choices=("gpu", "cpu"), default="gpu",
                   help="read optimizer state into device buffers or CPU memory, then move it across")
    g.add_argument("--async-save", action="store_true",
                   help="write checkpoints in the background while training continues")
    g.add_argument("--no-load-optim", action="store_true",
                   help="with --load: weights and counters only; a fresh optimizer and lr schedule")
    g.add_argument("--no-load-rng", action="store_true", help="with --load: keep this run's RNG streams")
    # Megatron spells these two with an underscore in the middle; so do we.
    g.add_argument("--override-opt_param-scheduler", "--override-opt-param-scheduler",
                   dest="override_opt_param_scheduler", action="store_true",
                   help="with --load: a schedule that differs from the checkpoint's is this run's")
    g.add_argument("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler",
                   dest="use_checkpoint_opt_param_scheduler", action="store_true",
                   help="with --load: a schedule that differs from the checkpoint's is the checkpoint's")

    g = p.add_argument_group("precision checks")
    g.add_argument("--calculate-per-token-loss", action="store_true",
                   help="normalise the loss by the tokens of the whole batch, not per sample")
    g.add_argument("--ci-save-grad-norm", default=None, help="record per-step grad norms and losses here")
    g.add_argument("--ci-load-grad-norm", default=None,
                   help="compare per-step grad norms (1 %%) and losses with a recording; stop at a mismatch")
    g.add_argument("--ci-wrong-normalisation", action="store_true",
                   help="test only: each micro-batch normalised by its own tokens, summed (a known bug)")


def check_checkpoint_flags(args: argparse.Namespace) -> None:
    """Checkpoint flags that only make sense together."""
    if args.save_interval is not None and (args.save is None or args.save_interval < 1):
        _fail("--save-interval needs --save DIR and a value >= 1")
    if args.ckpt_step is not None and args.load is None:
        _fail("--ckpt-step picks a step of --load DIR: add --load")
    if args.async_save and args.save is None:
        _fail("--async-save needs --save DIR")
    if args.override_opt_param_scheduler and args.use_checkpoint_opt_param_scheduler:
        _fail("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler exclude each other")
    if args.ckpt_step is not None:
        from slime.backends.fsdp.checkpoint import CheckpointError, resolve_step

        try:
            resolve_step(args.load, args.ckpt_step)
        except CheckpointError as e:
            _fail(f"--ckpt-step: {e}")


def check_training_path(args: argparse.Namespace, env: Mapping[str, str]) -> argparse.Namespace:
    """Fill the placement defaults of `train.py` and check what the loop needs; then `validate_args`."""
    if args.num_gpus is None:
        raw = env.get("NUM_GPUS", "").strip()
        if not raw.isdigit():
            _fail("--num-gpus is not set and NUM_GPUS is not in the environment; pass --num-gpus N")
        args.num_gpus = int(raw)
    if args.num_gpus < 1:
        _fail(f"--num-gpus must be >= 1, got {args.num_gpus}")
    if args.colocate:
        if args.rollout_num_gpus not in (None, args.num_gpus):
            _fail("--colocate shares every GPU; drop --rollout-num-gpus")
        trainer = args.num_gpus
    elif args.load_debug_rollout_data is not None:
        trainer = args.num_gpus  # no engines are started to replay a dump
    else:
        if args.rollout_num_gpus is None or not 1 <= args.rollout_num_gpus < args.num_gpus:
            _fail(
                f"without --colocate, --rollout-num-gpus must be between 1 and {args.num_gpus - 1} "
                f"(the rest train); got {args.rollout_num_gpus}"
            )
        trainer = args.num_gpus - args.rollout_num_gpus
    args.actor_num_nodes = 1
    args.actor_num_gpus_per_node = trainer
    if args.hf_checkpoint is None:
        _fail("--hf-checkpoint is required: the HF model directory to train")
    if args.prompt_data is None and args.load_debug_rollout_data is None:
        _fail("--prompt-data is required unless --load-debug-rollout-data replays saved rollouts")
    if args.num_rollout is None or args.num_rollout < 1:
        _fail("--num-rollout must be >= 1")
    if args.eval_interval is not None and (args.eval_interval < 1 or args.eval_prompt_data is None):
        _fail("--eval-interval needs a value >= 1 and --eval-prompt-data")
    if args.use_critic != (args.advantage_estimator == "ppo"):
        _fail("--use-critic goes with --advantage-estimator ppo, and ppo needs --use-critic")
    if args.advantage_estimator not in ("grpo", "ppo", "reinforce_plus_plus"):
        _fail(f"--advantage-estimator {args.advantage_estimator} is not trained by train.py; "
              "use grpo, ppo or reinforce_plus_plus")
    if args.rollout_temperature != 1.0:
        # Engines report log-probs of the untempered distribution; the trainer recomputes those.
        _fail("--rollout-temperature must be 1.0 for train.py (log-probs are compared untempered)")
    if args.ci_paired_eval_samples < 0:
        _fail(f"--ci-paired-eval-samples must be >= 0, got {args.ci_paired_eval_samples}")
    if args.ci_paired_eval_samples and args.load_debug_rollout_data is not None:
        _fail("--ci-paired-eval-samples samples through the engines, and a replay starts none; drop one")
    if args.ci_sleep_check and not args.colocate:
        _fail("--ci-sleep-check needs --colocate (engines sleep only when they share GPUs)")
    _load_sglang_config(args)
    check_checkpoint_flags(args)
    _check_schedule(args)
    return validate_args(args)


def _check_schedule(args: argparse.Namespace) -> None:
    """The lr schedule must be buildable before any rank starts (the same check the ranks run)."""
    from slime.backends.fsdp.lr_schedule import ScheduleError, schedule_for

    if args.weight_decay < 0:
        _fail(f"--weight-decay must be >= 0, got {args.weight_decay}")
    try:
        schedule_for(lr=args.lr, min_lr=args.min_lr, init_lr=args.lr_warmup_init, style=args.lr_decay_style,
                     warmup_iters=args.lr_warmup_iters, warmup_fraction=args.lr_warmup_fraction,
                     decay_iters=args.lr_decay_iters, train_iters=args.num_rollout)
    except ScheduleError as e:
        _fail(str(e))


def _load_sglang_config(args: argparse.Namespace) -> None:
    """Parse `--sglang-config` against the rollout's GPUs into `args.sglang_layout` (None without one)."""
    args.sglang_layout = None
    if args.rollout_num_gpus_per_engine < 1:
        _fail(f"--rollout-num-gpus-per-engine must be >= 1, got {args.rollout_num_gpus_per_engine}")
    if args.sglang_config is None:
        if args.rollout_num_gpus_per_engine != 1:
            _fail("--rollout-num-gpus-per-engine > 1 needs --sglang-config (engines of several GPUs)")
        return
    if args.load_debug_rollout_data is not None:
        _fail("--sglang-config starts engines, and replaying saved rollouts starts none; drop one of them")
    from slime.backends.engine.sglang_config import SglangConfigError, load

    rollout = args.num_gpus if args.colocate else args.rollout_num_gpus
    try:
        args.sglang_layout = load(args.sglang_config, rollout_num_gpus=rollout,
                                  num_gpus_per_engine=args.rollout_num_gpus_per_engine,
                                  offload=bool(args.colocate), gpus_per_node=args.num_gpus)
    except SglangConfigError as e:
        _fail(f"--sglang-config {e}")


def _fail(message: str) -> None:
    raise ArgumentsError(message)


def _check_batches(args: argparse.Namespace) -> None:
    for name in ("rollout_batch_size", "n_samples_per_prompt", "micro_batch_size"):
        if getattr(args, name) < 1:
            _fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    if args.global_batch_size is None and args.num_steps_per_rollout is None:
        args.num_steps_per_rollout = 1
    if args.global_batch_size is None:
        if samples % args.num_steps_per_rollout:
            _fail(
                f"rollout batch {args.rollout_batch_size} x {args.n_samples_per_prompt} samples = "
                f"{samples} samples do not split into {args.num_steps_per_rollout} steps; "
                "change --num-steps-per-rollout or --rollout-batch-size"
            )
        args.global_batch_size = samples // args.num_steps_per_rollout
    elif args.num_steps_per_rollout is None:
        if args.global_batch_size < 1 or samples % args.global_batch_size:
            _fail(
                f"{samples} samples per rollout are not a multiple of --global-batch-size "
                f"{args.global_batch_size}"
            )
        args.num_steps_per_rollout = samples // args.global_batch_size
    elif args.global_batch_size * args.num_steps_per_rollout != samples:
        _fail(
            f"--rollout-batch-size x --n-samples-per-prompt = {samples} must equal "
            f"--global-batch-size x --num-steps-per-rollout = "
            f"{args.global_batch_size * args.num_steps_per_rollout}"
        )
    if args.use_dynamic_batch_size:
        if not args.max_tokens_per_gpu or args.max_tokens_per_gpu < 1:
            _fail("--use-dynamic-batch-size needs --max-tokens-per-gpu > 0")
    elif args.global_batch_size % (args.dp_size * args.micro_batch_size):
        _fail(
            f"--global-batch-size {args.global_batch_size} must be a multiple of data-parallel "
            f"size {args.dp_size} x --micro-batch-size {args.micro_batch_size}"
        )


def _check_parallel(args: argparse.Namespace) -> None:
    world = args.actor_num_nodes * args.actor_num_gpus_per_node
    tp, pp, cp = (
        args.tensor_model_parallel_size,
        args.pipeline_model_parallel_size,
        args.context_parallel_size,
    )
    if min(world, tp, pp, cp, args.expert_model_parallel_size) < 1:
        _fail("GPU counts and parallel sizes must all be >= 1")
    if world % (tp * pp * cp):
        _fail(
            f"{world} GPUs do not divide into tensor {tp} x pipeline {pp} x context {cp} "
            f"= {tp * pp * cp}-GPU model replicas"
        )
    args.world_size = world
    args.dp_size = world // (tp * pp * cp)
    checks = [
        ("num_attention_heads", tp, "--tensor-model-parallel-size"),
        ("num_query_groups", tp, "--tensor-model-parallel-size"),
        ("num_layers", pp, "--pipeline-model-parallel-size"),
        ("num_experts", args.expert_model_parallel_size, "--expert-model-parallel-size"),
    ]
    for name, size, flag in checks:
        value = getattr(args, name)
        if value is not None and value % size:
            _fail(f"--{name.replace('_', '-')} {value} is not divisible by {flag} {size}")
    if args.expert_model_parallel_size > 1 and args.num_experts is None:
        _fail("--expert-model-parallel-size > 1 needs a MoE model (--num-experts)")


# HF config keys for each Megatron-style argument; the first present key wins.
HF_KEYS: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size",),
    "num_layers": ("num_hidden_layers",),
    "num_attention_heads": ("num_attention_heads",),
    "num_query_groups": ("num_key_value_heads",),
    "ffn_hidden_size": ("intermediate_size",),
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts"),
    "moe_ffn_hidden_size": ("moe_intermediate_size",),
    "moe_router_topk": ("num_experts_per_tok",),
}


def read_hf_config(checkpoint: str | os.PathLike[str]) -> dict[str, Any]:
    """The `config.json` of a HF checkpoint directory (text config of multimodal models)."""
    path = Path(checkpoint) / "config.json"
    if not path.is_file():
        _fail(f"--hf-checkpoint {checkpoint}: no config.json there; point it at a HF model directory")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArgumentsError(f"{path} is not valid JSON: {exc}") from None
    return dict(config.get("text_config", config))


def _check_hf_config(args: argparse.Namespace) -> None:
    if args.hf_checkpoint is None:
        return
    config = read_hf_config(args.hf_checkpoint)
    mismatches = []
    for name, keys in HF_KEYS.items():
        ours = getattr(args, name)
        theirs = next((config[k] for k in keys if k in config), None)
        if ours is None or theirs is None:
            continue
        if ours != theirs:
            mismatches.append(f"--{name.replace('_', '-')} {ours} vs {keys[0]} {theirs}")
    vocab = config.get("vocab_size")
    if args.vocab_size is not None and vocab is not None and args.vocab_size < vocab:
        mismatches.append(f"--vocab-size {args.vocab_size} is smaller than vocab_size {vocab}")
    if mismatches:
        _fail(
            f"model arguments disagree with {args.hf_checkpoint}/config.json: "
            + "; ".join(mismatches)
        )


def _check_debug_paths(args: argparse.Namespace) -> None:
    for flag in ("save_debug_rollout_data", "load_debug_rollout_data"):
        value = getattr(args, flag)
        if value is not None and "{rollout_id}" not in value:
            _fail(
                f"--{flag.replace('_', '-')} {value!r} must contain '{{rollout_id}}' "
                "so each rollout gets its own file"
            )
    if args.debug_rollout_only and args.debug_train_only:
        _fail("--debug-rollout-only and --debug-train-only exclude each other")
    if args.load_debug_rollout_data is not None:
        if args.debug_rollout_only:
            _fail("--load-debug-rollout-data replaces the rollout; it cannot go with --debug-rollout-only")
        first = args.load_debug_rollout_data.format(rollout_id=args.start_rollout_id)
        if not Path(first).is_file():
            _fail(
                f"--load-debug-rollout-data: {first} does not exist; "
                "save it first with --save-debug-rollout-data"
            )


def _check_algorithm(args: argparse.Namespace) -> None:
    if args.rollout_max_response_len < 1:
        _fail(f"--rollout-max-response-len must be >= 1, got {args.rollout_max_response_len}")
    if not args.rollout_temperature > 0:
        _fail(f"--rollout-temperature must be positive, got {args.rollout_temperature}")
    if args.eps_clip <= 0 or (args.eps_clip_high is not None and args.eps_clip_high <= 0):
        _fail("--eps-clip and --eps-clip-high must be positive")
    if args.eps_clip_c is not None and args.eps_clip_c <= 1.0:
        _fail(f"--eps-clip-c is a dual-clip bound and must be > 1.0, got {args.eps_clip_c}")
    if args.rm_type is not None:
        from slime.rollout.rm_hub import RM_TYPES

        if args.rm_type not in RM_TYPES:
            _fail(f"--rm-type {args.rm_type!r} is unknown; pick one of {', '.join(RM_TYPES)}")


def validate_args(args: argparse.Namespace) -> argparse.Namespace:
    """Check and complete parsed arguments (derives dp_size, global batch or steps)."""
    _check_parallel(args)
    _check_batches(args)
    _check_hf_config(args)
    _check_debug_paths(args)
    _check_algorithm(args)
    return args


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse and validate the trainer's command line."""
    return validate_args(build_parser().parse_args(list(argv)))
