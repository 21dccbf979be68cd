"""Take the figures of the five checks on one device; `judge` decides whether they hold.

One process: the tiny model is built and warmed up in a temporary directory, one trainer rank
(`TrainRank`) joins a process group of one (NCCL on CUDA, gloo on CPU, TCP on loopback), and
the loop's own functions run it against an `Engine` of this process. A check whose code raises
records the error as its figure; a later check that needs its results records that it could
not run.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import resource
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Rollout shape of every check: prompts × samples, answers of a few tokens (the arith task).
GRPO_FLAGS = ("--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.001",
              "--kl-loss-type", "k3", "--refit-from", "tensor", "--rm-type", "arith")
PROBE_SEEDS = (777, 778, 779, 780)


@dataclass(frozen=True, kw_only=True)
class Options:
    """What to run: device, sizes, seed."""

    device: str  # "cpu" | "cuda"
    steps: int = 4
    prompts: int = 16
    samples_per_prompt: int = 4
    max_new_tokens: int = 4
    warmup_steps: int = 200
    lr: float = 8e-4
    seed: int = 0


@dataclass
class _State:
    """What the checks hand each other while they run."""

    opts: Options
    root: Path
    model_dir: Path
    data_dir: Path
    args: argparse.Namespace
    tokenizer: Any = None
    rank: Any = None
    engine: Any = None
    run: Any = None
    final_state: dict[str, torch.Tensor] | None = None
    resident_bytes: int = 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _error(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" ({Path(frame.filename).name}:{frame.lineno})" if frame else ""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{where}"


def train_args(opts: Options, model_dir: Path, data_dir: Path, out: Path,
               extra: tuple[str, ...] = ()) -> argparse.Namespace:
    """The `train.py` command line of the run, parsed and checked by the trainer's own parser."""
    from slime.utils.arguments import build_parser, check_training_path

    argv = ["--hf-checkpoint", str(model_dir), "--prompt-data", str(data_dir / "train.jsonl"),
            "--num-gpus", "1", "--colocate", "--ci-test", "--ci-sleep-check",
            "--rollout-batch-size", str(opts.prompts), "--n-samples-per-prompt", str(opts.samples_per_prompt),
            "--num-rollout", str(opts.steps), "--rollout-max-response-len", str(opts.max_new_tokens),
            "--rollout-shuffle", "--lr", str(opts.lr), "--seed", str(opts.seed), "--output-dir", str(out),
            *GRPO_FLAGS, *extra]
    return check_training_path(build_parser().parse_args(argv), env={})


def _new_rank(state: _State) -> Any:
    from slime.backends.fsdp.config import TrainerConfig
    from slime.backends.fsdp.rank import TrainRank

    # The first rank makes the process group (tcp on loopback); later ones join the one there is.
    return TrainRank(rank=0, world_size=1, master_addr="127.0.0.1", master_port=_free_port(),
                     config=TrainerConfig.from_args(state.args), device=state.opts.device)


def _new_run(state: _State, args: argparse.Namespace, trainer: Any) -> Any:
    from slime.device_check.local import LocalEngines
    from slime.loop import Run
    from slime.rollout.source import PromptSource, read_prompts

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    run = Run(args=args, out=out, trainer=trainer, engines=LocalEngines(state.engine),
              tokenizer=state.tokenizer)
    args.eos_token_id = state.tokenizer.eos_token_id
    run.source = PromptSource(read_prompts(args.prompt_data), shuffle=args.rollout_shuffle, seed=args.seed)
    run.eval_prompts = read_prompts(state.data_dir / "eval.jsonl")
    return run


def _tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# ---- setup ---------------------------------------------------------------------------------
def setup(opts: Options, root: Path) -> tuple[_State, dict[str, Any]]:
    """Model, data, the trainer rank and the fp32 engine; the environment's figures."""
    from transformers import AutoTokenizer

    from slime.backends.engine.engine import Engine
    from slime.model.arith_data import write_dataset
    from slime.model.tiny import build_tiny_model
    from slime.model.warmup import warm_up

    start = time.perf_counter()
    data_dir = write_dataset(root / "data", seed=opts.seed)
    model_dir = build_tiny_model(root / "model", seed=opts.seed)
    if opts.warmup_steps:
        warm_up(model_dir, data_dir / "train.jsonl", steps=opts.warmup_steps, seed=opts.seed)
    prepared = time.perf_counter() - start
    args = train_args(opts, model_dir, data_dir, root / "run", ("--save", str(root / "ckpt"),
                                                                "--save-interval", str(opts.steps // 2)))
    state = _State(opts=opts, root=root, model_dir=model_dir, data_dir=data_dir, args=args)
    state.tokenizer = AutoTokenizer.from_pretrained(model_dir)
    state.rank = _new_rank(state)
    state.engine = Engine(model_dir, device=opts.device, seed=opts.seed)
    import torch.distributed as dist

    env = {"device": opts.device, "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
           "device_name": (torch.cuda.get_device_name() if opts.device == "cuda" else "cpu"),
           "backend": str(dist.get_backend()), "world_size": dist.get_world_size(),
           "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
           "prepare_seconds": prepared, "warmup_steps": opts.warmup_steps,
           "engine_model_bytes": state.engine.model_bytes(),
           "trainer_param_bytes": _tensor_bytes(p.to_local() if hasattr(p, "to_local") else p
                                                for p in state.rank.policy.parameters())}
    state.resident_bytes = env["engine_model_bytes"] + env["trainer_param_bytes"]
    return state, env


# ---- 1: engine vs trainer log-probs, fp32 and bf16 ---------------------------------------------
def _rollout(state: _State, client: Any, rollout_id: int) -> Any:
    from slime.loop import _spec
    from slime.rollout.batch import batch_from_groups
    from slime.rollout.generate import generate_groups
    from slime.rollout.source import read_prompts

    prompts = read_prompts(state.data_dir / "train.jsonl")[:state.opts.prompts]
    spec = _spec(state.args, n=state.opts.samples_per_prompt)
    groups, version = generate_groups([client], state.tokenizer, prompts, spec, rollout_id=rollout_id)
    return batch_from_groups(groups, rollout_id=rollout_id, advantage_estimator="grpo",
                             weight_version=int(version))


def _gaps(trainer: list[list[float]], rollout: Any) -> dict[str, Any]:
    diffs = [abs(a - b) for t, r in zip(trainer, rollout, strict=True) for a, b in zip(t, r, strict=True)]
    return {"gap_max": max(diffs), "gap_mean": sum(diffs) / len(diffs), "tokens": len(diffs)}


def _weights_to(model: torch.nn.Module, dtype: torch.dtype) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(dtype)


def check_logprobs(state: _State) -> dict[str, Any]:
    """Engine (KV cache) vs trainer forward on the same tokens, per dtype; where tensors live."""
    from slime.backends.engine.engine import Engine
    from slime.device_check.local import LocalClient, trainer_log_probs

    device = torch.device(state.opts.device)
    out: dict[str, Any] = {"tolerance_source": "--ci-logprob-tol default (fp32)",
                           "ci_logprob_tol": state.args.ci_logprob_tol}
    engines = {"fp32": state.engine}
    half = Engine(state.model_dir, device=state.opts.device, seed=state.opts.seed)
    # The engine's own worker casts its weights, and so the KV cache it fills, to bf16. Buffers
    # (the rotary frequencies) stay fp32, as a serving engine keeps them.
    half.call(lambda: _weights_to(half.model, torch.bfloat16))
    engines["bf16"] = half
    try:
        for name, engine in engines.items():
            client = LocalClient(engine, name)
            batch = _rollout(state, client, rollout_id=1000)
            autocast = torch.bfloat16 if name == "bf16" else None
            figures = _gaps(trainer_log_probs(state.rank, batch, autocast), batch.rollout_log_probs)
            figures["engine_dtypes"] = sorted({str(p.dtype) for p in engine.model.parameters()})
            figures["engine_device"] = str(engine.device)
            figures["off_device_tensors"] = sum(t.device.type != device.type for _, t in
                                                engine._tensors())
            figures["generated_tokens"] = client.tokens_generated
            figures["tokens_per_s"] = client.tokens_generated / max(client.generate_seconds, 1e-9)
            out[name] = figures
    finally:
        half.close()
    out["trainer_off_device_params"] = sum(p.device.type != device.type
                                           for p in state.rank.policy.parameters())
    return out


# ---- 2: GRPO steps through the loop, refit ---------------------------------------------------
def check_grpo(state: _State) -> dict[str, Any]:
    """`--num-rollout` steps of `slime.loop.run_sync` (colocated, --ci-test, --ci-sleep-check)."""
    from slime import invariants as inv
    from slime import loop
    from slime import resume as ckpt
    from slime.device_check.local import LocalTrainer, trainer_log_probs

    trainer = LocalTrainer(state.rank)
    run = state.run = _new_run(state, state.args, trainer)
    out: dict[str, Any] = {"eval_reward_before": loop.evaluate(run, -1)["eval/reward"]}
    start = time.perf_counter()
    try:
        loop.run_sync(run)
    except inv.InvariantViolation as exc:
        out["invariant"] = str(exc)
    ckpt.finish(run)
    out["loop_seconds"] = time.perf_counter() - start
    out["steps"] = [_step_figures(row) for row in run.history]
    out["surrogate_gains"] = list(trainer.surrogate_gains)
    out["trainer_version"] = trainer.version()
    out["engine_version"] = str(state.engine.weight_version)
    out["rollout_tokens"] = run.engines.client.tokens_generated
    out["rollout_generate_seconds"] = run.engines.client.generate_seconds
    # One rollout more from the refit engine: its log-probs against the trained policy's.
    after = loop.make_batch(run, state.args.start_rollout_id + state.args.num_rollout)
    out["refit_gap"] = _gaps(trainer_log_probs(state.rank, after), after.rollout_log_probs)
    out["eval_reward_after"] = loop.evaluate(run, state.args.num_rollout)["eval/reward"]
    out["rollout_reward_first"] = run.history[0]["rollout/reward"] if run.history else math.nan
    out["rollout_reward_after"] = after.mean_reward()
    state.final_state = trainer.full_state_dict()
    return out


_STEP_KEYS = ("step", "rollout_id", "rollout/reward", "train/loss", "train/grad_norm", "train/kl_loss",
              "train/ppo_kl_abs_max", "check/logprob_abs_diff_max", "check/logprob_abs_diff_mean",
              "check/is_ratio_min", "check/is_ratio_max", "train/seconds", "refit/seconds",
              "refit/version", "refit/engine_versions", "sleep/bytes_awake", "sleep/bytes_released",
              "sleep/bytes_resumed", "sleep/probe_before", "sleep/probe_after")


def _step_figures(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in _STEP_KEYS if k in row}


# ---- 3: sleep / wake ----------------------------------------------------------------------
def _probe(state: _State) -> list[dict[str, Any]]:
    from slime.device_check.local import LocalClient
    from slime.rollout.source import read_prompts

    prompts = read_prompts(state.data_dir / "eval.jsonl")[:len(PROBE_SEEDS)]
    ids = [list(state.tokenizer(p.text)["input_ids"]) for p in prompts]
    from slime.backends.engine.wire import SamplingParams, parse_outputs

    params = [SamplingParams(max_new_tokens=state.opts.max_new_tokens, temperature=1.0, seed=s).to_json()
              for s in PROBE_SEEDS]
    answers = parse_outputs(LocalClient(state.engine, "probe").generate(ids, params), len(ids))
    return [{"ids": list(a.output_ids), "logprobs": list(a.logprobs)} for a in answers]


def _held(state: _State) -> dict[str, Any]:
    _sync(state.opts.device)
    held: dict[str, Any] = {"engine_bytes": state.engine.model_bytes()}
    if state.opts.device == "cuda":
        held["cuda_allocated"] = torch.cuda.memory_allocated()
        held["cuda_reserved"] = torch.cuda.memory_reserved()
    return held


def check_sleep(state: _State) -> dict[str, Any]:
    """Bytes held before, while released and after resume; the same seeded generations around it."""
    engine = state.engine
    out: dict[str, Any] = {"probe_before": _probe(state), "before": _held(state)}
    engine.release_memory()
    out["released"] = _held(state)
    out["released_flag"] = bool(engine.released)
    engine.resume_memory()
    out["after"] = _held(state)
    out["probe_after"] = _probe(state)
    if state.run is not None:  # what the loop's own --ci-sleep-check recorded at every step
        out["loop_steps"] = [{k: row.get(k) for k in ("sleep/bytes_awake", "sleep/bytes_released",
                                                      "sleep/bytes_resumed")}
                             | {"probe_same": row.get("sleep/probe_before") == row.get("sleep/probe_after")}
                             for row in state.run.history]
    return out


# ---- 4: checkpoint save + resume ---------------------------------------------------------
def check_resume(state: _State) -> dict[str, Any]:
    """Resume from the middle checkpoint of check 2's run; the rest must equal that run."""
    from slime import loop
    from slime import resume as ckpt
    from slime.device_check.local import LocalTrainer

    if state.run is None or state.final_state is None:
        raise RuntimeError("check 2's run did not finish; nothing to resume")
    middle = state.opts.steps // 2
    args = train_args(state.opts, state.model_dir, state.data_dir, state.root / "resumed",
                      ("--load", str(state.root / "ckpt"), "--ckpt-step", str(middle)))
    # The uninterrupted run's trainer goes first: the resumed one starts from nothing but disk.
    state.run.trainer = None
    state.rank = None
    gc.collect()
    state.rank = _new_rank(state)
    trainer = LocalTrainer(state.rank)
    run = _new_run(state, args, trainer)
    ckpt.resume(run)
    loop.refit(run, -1)  # as `setup` does after --load: engines serve the resumed weights
    loop.run_sync(run)
    resumed = trainer.full_state_dict()
    diffs = {k: float((resumed[k].double() - v.double()).abs().max()) for k, v in state.final_state.items()}
    uninterrupted = [_step_figures(r) for r in state.run.history[middle:]]
    again = [_step_figures(r) for r in run.history]
    compared = ("rollout/reward", "train/loss", "train/grad_norm", "check/logprob_abs_diff_max")
    return {"resumed_from_step": middle, "start_rollout_id": args.start_rollout_id,
            "version_after": trainer.version(), "expected_version": state.opts.steps,
            "weights_max_abs_diff": max(diffs.values()),
            "weights_bitwise": all(torch.equal(resumed[k], v) for k, v in state.final_state.items()),
            "missing_keys": sorted(set(state.final_state) ^ set(resumed)),
            "metric_diffs": [{k: abs(float(a[k]) - float(b[k])) for k in compared if k in a and k in b}
                             for a, b in zip(uninterrupted, again, strict=False)],
            "steps_uninterrupted": len(uninterrupted), "steps_resumed": len(again)}


# ---- 5: timings -----------------------------------------------------------------------------
def check_timings(state: _State, figures: dict[str, Any]) -> dict[str, Any]:
    """Generation tokens/s, training steps/s, peak memory (device on CUDA, process RSS on CPU)."""
    logprobs, grpo = figures.get("logprobs", {}), figures.get("grpo", {})
    steps = grpo.get("steps", [])
    train_s = sum(float(s.get("train/seconds", 0.0)) for s in steps)
    refit_s = [float(s["refit/seconds"]) for s in steps if "refit/seconds" in s]
    out: dict[str, Any] = {
        "gen_tokens_per_s_fp32": logprobs.get("fp32", {}).get("tokens_per_s"),
        "gen_tokens_per_s_bf16": logprobs.get("bf16", {}).get("tokens_per_s"),
        "rollout_tokens_per_s": (grpo["rollout_tokens"] / grpo["rollout_generate_seconds"]
                                 if grpo.get("rollout_generate_seconds") else None),
        "train_steps_per_s": len(steps) / train_s if train_s > 0 else None,
        "refit_seconds_mean": sum(refit_s) / len(refit_s) if refit_s else None,
        "resident_lower_bound_bytes": state.resident_bytes,
    }
    if state.opts.device == "cuda":
        out["peak_bytes"] = torch.cuda.max_memory_allocated()
        out["peak_kind"] = "torch.cuda.max_memory_allocated"
    else:
        # ru_maxrss is in KiB on Linux: the process's peak resident set, a bound on what it held.
        out["peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out["peak_kind"] = "ru_maxrss (process, CPU)"
    return out


# ---- all of it ------------------------------------------------------------------------------
CHECKS: tuple[tuple[str, Callable[[_State], dict[str, Any]]], ...] = (
    ("logprobs", check_logprobs),
    ("grpo", check_grpo),
    ("sleep", check_sleep),
    ("resume", check_resume),
)


def measure(opts: Options) -> dict[str, Any]:
    """Every figure of every check, keyed by check name (`env` first); errors recorded as figures."""
    import torch.distributed as dist

    if opts.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="slime-cuda-check-") as tmp:
        state = None
        try:
            state, figures["env"] = setup(opts, Path(tmp))
            for name, fn in CHECKS:
                start = time.perf_counter()
                try:
                    figures[name] = fn(state)
                except Exception as exc:
                    figures[name] = {"error": _error(exc)}
                figures[name]["seconds"] = time.perf_counter() - start
            figures["timings"] = check_timings(state, figures)
        except Exception as exc:
            figures["env"] = {**figures.get("env", {}), "error": _error(exc)}
        finally:
            if state is not None and state.engine is not None:
                state.engine.close()
            if dist.is_initialized():
                dist.destroy_process_group()
    return figures


def prepare_process(device: str) -> None:
    """Before CUDA starts: deterministic kernels where torch has them, so resume can be bitwise."""
    if device == "cuda":
        # cuBLAS picks a reproducible reduction order only with a fixed workspace (set before init).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
