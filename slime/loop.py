"""The RL loop behind `train.py` and `train_async.py`.

rollout (engines, HTTP) → reward (rm_hub) → dynamic filter → train (FSDP2 ranks) → refit the
engines to version + 1 → evaluate every `--eval-interval`. Colocated, engines release their
memory while the trainer steps and resume after; disaggregated, they keep their GPUs. The
asynchronous loop generates rollout k + 1 while the trainer steps on rollout k, so each step
after the first trains on a rollout one weight version old.

Every step prints one progress line and appends one JSON line to `<output-dir>/metrics.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from slime import invariants as inv
from slime import resume as ckpt
from slime.backends.engine.wire import SamplingParams, parse_outputs
from slime.loop_parts import Engines, FaultTolerantEngines, Tokenizer, Trainer
from slime.rollout.batch import TrainBatch, batch_from_groups, load_batch, save_batch
from slime.rollout.filter import dynamic_filter, trim_to_multiple
from slime.rollout.generate import RolloutSpec, generate_groups
from slime.rollout.source import PromptSource, read_prompts

# Weight directories kept on disk: the one engines serve and the one before it.
KEEP_VERSIONS = 2


@dataclass
class Run:
    """Everything one run holds: arguments, actors, data, the metrics file.

    No trainer when only rolling out (`--debug-rollout-only`), no engines (and no tokenizer)
    when training on saved rollouts (`--load-debug-rollout-data`).
    """

    args: argparse.Namespace
    out: Path
    trainer: Trainer | None = None
    engines: Engines | None = None
    tokenizer: Tokenizer | None = None
    source: PromptSource | None = None
    eval_prompts: list[Any] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    frozen_digests: dict[str, Any] = field(default_factory=dict)  # frozen engine → weights at start

    def record(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        with (self.out / "metrics.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, sort_keys=True) + "\n")


def _spec(args: argparse.Namespace, *, n: int, temperature: float | None = None) -> RolloutSpec:
    stop = (int(args.eos_token_id),) if getattr(args, "eos_token_id", None) is not None else ()
    return RolloutSpec(n_samples_per_prompt=n, max_new_tokens=args.rollout_max_response_len,
                       temperature=args.rollout_temperature if temperature is None else temperature,
                       top_p=args.rollout_top_p, stop_token_ids=stop, rm_type=args.rm_type or "arith",
                       seed=args.seed)


def setup(args: argparse.Namespace, env: Mapping[str, str]) -> Run:
    """Placement group, trainer ranks and engines (only those the mode needs), data."""
    import ray

    from slime.backends.fsdp.config import TrainerConfig
    from slime.backends.fsdp.group import TrainGroup
    from slime.ray.engines import EngineGroup
    from slime.ray.placement import Placement, create_placement_group, plan_layout

    out = Path(args.output_dir or env.get("SLIME_CI_OUTPUT_DIR") or "outputs")
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)  # one run's steps, not an earlier run's too
    run = Run(args=args, out=out)
    ray.init(address=env.get("RAY_ADDRESS") or "auto", log_to_driver=True)
    pg = create_placement_group(args.num_gpus)
    replay = args.load_debug_rollout_data is not None
    if replay:
        # Training on saved rollouts: every bundle is the trainer's, and no engine starts.
        layout = Placement(num_gpus=args.num_gpus, colocate=False,
                           trainer_bundles=tuple(range(args.num_gpus)), engine_bundles=(),
                           trainer_gpus=1.0, engine_gpus=0.0)
    else:
        layout = plan_layout(args.num_gpus, colocate=args.colocate, rollout_num_gpus=args.rollout_num_gpus)
    import torch

    # The CPU kernel set (ATEN_CPU_CAPABILITY) decides float rounding on CPU ranks and engines.
    print(f"placement: {args.num_gpus} GPU bundles; trainer on {list(layout.trainer_bundles)}, "
          f"engines on {list(layout.engine_bundles)}{' (colocated)' if layout.colocate else ''}; "
          f"cpu capability {torch.backends.cpu.get_cpu_capability().lower()}", flush=True)
    if not replay:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
        args.eos_token_id = tokenizer.eos_token_id
        run.tokenizer = tokenizer
        run.source = PromptSource(read_prompts(args.prompt_data, prompt_key=args.input_key,
                                               label_key=args.label_key),
                                  shuffle=args.rollout_shuffle, seed=args.seed)
        if args.eval_prompt_data:
            run.eval_prompts = read_prompts(args.eval_prompt_data, prompt_key=args.input_key,
                                            label_key=args.label_key)
        run.engines = EngineGroup(pg, layout, args.hf_checkpoint, seed=args.seed, env=env,
                                  backend=args.rollout_backend, config=getattr(args, "sglang_layout", None),
                                  fault_tolerance=args.use_fault_tolerance,
                                  on_restart=lambda _group: write_engines(run),
                                  start_timeout=args.engine_start_timeout,
                                  weights_dirs=[str(run.out / "weights")])
        run.frozen_digests = {s["name"]: s.get("weights_digest") for s in run.engines.info()
                              if not s["update_weights"]}
    write_engines(run)
    if not args.debug_rollout_only:
        run.trainer = TrainGroup(pg, layout, TrainerConfig.from_args(args), env=env)
        ckpt.resume(run)
        if args.load is not None and run.engines is not None:
            refit(run, -1)  # engines came up with --hf-checkpoint: serve the resumed weights
    return run


def write_engines(run: Run) -> None:
    """`engines.json`: every engine now (name, model, bundles, pid, GPUs, URL, restarts…).

    Written at start and again after an engine is restarted, so a test can find the pid of
    the engine it wants to stop and see the one that replaced it.
    """
    info = [] if run.engines is None else run.engines.info()
    tmp = run.out / "engines.json.tmp"
    tmp.write_text(json.dumps({"started": len(info), "info": info,
                               "restarts": 0 if run.engines is None else run.engines.restarts},
                              indent=1, default=str))
    tmp.replace(run.out / "engines.json")


def make_batch(run: Run, rollout_id: int) -> TrainBatch:
    """One rollout: generate, grade, filter, trim to the data-parallel size; or load a dump."""
    args = run.args
    if args.load_debug_rollout_data is not None:
        return load_batch(args.load_debug_rollout_data, rollout_id)
    assert run.source is not None
    assert run.engines is not None
    start = time.monotonic()
    prompts = run.source.next_batch(args.rollout_batch_size)
    recover = None
    if args.use_fault_tolerance:  # setup made an EngineGroup that restarts and retries
        cast(FaultTolerantEngines, run.engines).ensure_healthy()
        recover = cast(FaultTolerantEngines, run.engines).recover
    groups, version = generate_groups(run.engines.clients, run.tokenizer, prompts,
                                      _spec(args, n=args.n_samples_per_prompt), rollout_id=rollout_id,
                                      recover=recover)
    all_rewards = [float(s.reward) for g in groups for s in g]  # type: ignore[arg-type]
    stats = {"rollout/reward_all": sum(all_rewards) / len(all_rewards),
             "rollout/seconds": time.monotonic() - start,
             "rollout/response_len": sum(s.response_length for g in groups for s in g) / len(all_rewards)}
    if args.dynamic_sampling_filter:
        result = dynamic_filter(groups)
        stats.update(result.stats())
        groups = result.kept
    world = args.actor_num_gpus_per_node
    kept = trim_to_multiple(groups, world)
    stats["rollout/trimmed_groups"] = float(len(groups) - len(kept))
    if not kept:
        raise RuntimeError(f"rollout {rollout_id}: no group left to train on after filtering "
                           f"({len(all_rewards)} samples); raise --rollout-batch-size")
    if args.use_fault_tolerance:
        stats["ft/restarts"] = float(run.engines.restarts)
        stats["ft/retried_requests"] = float(cast(FaultTolerantEngines, run.engines).retried_requests)
    batch = batch_from_groups(kept, rollout_id=rollout_id, advantage_estimator=args.advantage_estimator,
                              weight_version=int(version), stats=stats)
    if args.save_debug_rollout_data:
        path = save_batch(batch, args.save_debug_rollout_data)
        print(f"rollout {rollout_id} saved to {path}", flush=True)
    return batch


def refit(run: Run, step: int) -> dict[str, Any]:
    """Push the trainer's weights to every engine as the trainer's version; check it landed."""
    args = run.args
    assert run.trainer is not None, "refit needs a trainer"
    assert run.engines is not None, "refit needs engines"
    version = run.trainer.version()
    start = time.monotonic()
    if args.refit_from == "disk":
        path = run.trainer.export_hf(str(run.out / "weights" / f"version_{version}"))
        run.engines.refit_from_disk(path, version)
        stale = run.out / "weights" / f"version_{version - KEEP_VERSIONS}"
        shutil.rmtree(stale, ignore_errors=True)
    else:
        run.engines.refit_from_tensors(run.trainer.full_state_dict(), version)
    versions = run.engines.versions()
    row: dict[str, Any] = {"refit/seconds": time.monotonic() - start, "refit/version": version,
                           "refit/engine_versions": versions}
    if args.ci_test:
        inv.check_engine_versions(versions, version, step)
        states = _engine_states(run)
        inv.check_frozen_engines(states, run.frozen_digests, step)
        row["engines"] = states
    return row


def _engine_states(run: Run) -> list[dict[str, Any]]:
    keep = ("name", "model", "update_weights", "offload", "weight_version", "weights_digest",
            "model_bytes", "pid", "restarts", "requests_served")
    assert run.engines is not None
    return [{k: info.get(k) for k in keep} for info in run.engines.info()]


def evaluate(run: Run, rollout_id: int) -> dict[str, float]:
    """Mean reward on the eval prompts (greedy when one sample per prompt) of the policy, and of
    every frozen model the engines serve (`eval/reward@<model>`)."""
    args = run.args
    temperature = 1.0 if args.n_samples_per_eval_prompt > 1 else 0.0
    spec = _spec(args, n=args.n_samples_per_eval_prompt, temperature=temperature)
    out = {}
    assert run.engines is not None, "evaluation needs engines"
    frozen = dict.fromkeys(s.spec.model for s in run.engines.frozen)
    for key, clients in [("eval/reward", run.engines.clients),
                         *((f"eval/reward@{m}", run.engines.clients_of(m)) for m in frozen)]:
        groups, _ = generate_groups(clients, run.tokenizer, run.eval_prompts, spec,
                                    rollout_id=-1 - rollout_id)
        rewards = [float(s.reward) for g in groups for s in g]  # type: ignore[arg-type]
        out[key] = sum(rewards) / len(rewards)
    return out


def _probe(run: Run) -> list[list[int]]:
    assert run.source is not None
    assert run.tokenizer is not None
    assert run.engines is not None
    prompts = run.source.prompts[:4]
    ids = [list(run.tokenizer(p.text)["input_ids"]) for p in prompts]
    params = [SamplingParams(max_new_tokens=run.args.rollout_max_response_len, temperature=1.0,
                             seed=777 + i).to_json() for i in range(len(ids))]
    answers = parse_outputs(run.engines.clients[0].generate(ids, params), len(ids))
    return [list(a.output_ids) for a in answers]


def _engine_bytes(run: Run) -> list[int]:
    assert run.engines is not None
    return [int(info.get("model_bytes", -1)) for info in run.engines.info()]


def train_step(run: Run, batch: TrainBatch, step: int) -> dict[str, Any]:
    """Train on `batch`; colocated engines sleep meanwhile. Returns the step's metrics."""
    args = run.args
    assert run.trainer is not None
    row: dict[str, Any] = {}
    sleeping = run.engines if args.colocate else None  # colocated engines give up their memory
    if sleeping is not None:
        if args.ci_sleep_check:
            row["sleep/probe_before"] = _probe(run)
            row["sleep/bytes_awake"] = _engine_bytes(run)
        sleeping.release()
        if args.ci_sleep_check:
            row["sleep/bytes_released"] = _engine_bytes(run)
    train_start = time.time()
    metrics = run.trainer.train(batch)
    row["train/start"], row["train/end"] = train_start, time.time()
    if sleeping is not None:
        if args.ci_sleep_check:
            row["sleep/bytes_during_train"] = _engine_bytes(run)
        sleeping.resume()
        if args.ci_sleep_check:
            row["sleep/bytes_resumed"] = _engine_bytes(run)
            row["sleep/probe_after"] = _probe(run)
    row.update(metrics)
    return row


def _progress(row: Mapping[str, Any]) -> str:
    ratio = row.get("check/is_ratio_mean", float("nan"))
    kl = row.get("train/kl_loss", float("nan"))
    return (f"step {row['step']} | rollout {row['rollout_id']} | reward {row['rollout/reward']:.3f} | "
            f"loss {row['train/loss']:+.4f} | kl {kl:.2e} | ratio {ratio:.4f} | "
            f"lag {row.get('lag', 0)} | {row['seconds']:.1f} s")


def _check(run: Run, row: Mapping[str, Any], step: int, *, on_policy: bool, untrained: bool) -> None:
    args = run.args
    if "ci/grad_norm_mismatch" in row:  # --ci-load-grad-norm: a replayed step left the tolerance
        raise inv.InvariantViolation(f"grad-norm replay failed at {row['ci/grad_norm_mismatch']}")
    if not args.ci_test:
        return
    if untrained:  # the first step of a fresh run; a resumed run's policy has left the reference
        inv.check_step0(row)
    inv.check_sane(row, step)
    if on_policy:
        inv.check_on_policy(row, step, logprob_tol=args.ci_logprob_tol, ratio_band=args.ci_ratio_band)


def _finish_row(run: Run, row: dict[str, Any], batch: TrainBatch, step: int, rollout_id: int,
                start: float, lag: int) -> None:
    row.update({"step": step, "rollout_id": rollout_id, "lag": lag,
                "rollout/weight_version": batch.weight_version, "rollout/reward": batch.mean_reward(),
                "rollout/samples": batch.size, **batch.stats})
    if run.engines is not None and run.args.eval_interval and (rollout_id + 1) % run.args.eval_interval == 0:
        row.update(evaluate(run, rollout_id))
    row["seconds"] = time.monotonic() - start
    run.record(row)
    print(_progress(row), flush=True)


def run_sync(run: Run) -> None:
    """rollout → train → refit, one after the other."""
    args = run.args
    for step, rollout_id in enumerate(range(args.start_rollout_id, args.start_rollout_id + args.num_rollout)):
        start = time.monotonic()
        batch = make_batch(run, rollout_id)
        if args.debug_rollout_only:
            run.record({"step": step, "rollout_id": rollout_id, "rollout/reward": batch.mean_reward(),
                        "rollout/samples": batch.size, **batch.stats})
            print(f"step {step} | rollout {rollout_id} | reward {batch.mean_reward():.3f} | rollout only",
                  flush=True)
            continue
        assert run.trainer is not None
        version_before = run.trainer.version()
        lag = version_before - batch.weight_version if run.engines is not None else 0
        row = train_step(run, batch, step)
        _check(run, row, step, on_policy=run.engines is not None, untrained=version_before == 0)
        if run.engines is not None:
            row.update(refit(run, step))
        _finish_row(run, row, batch, step, rollout_id, start, lag)
        ckpt.maybe_save(run, rollout_id)


def run_async(run: Run) -> None:
    """Rollout k + 1 is generated (engines) while the trainer steps on rollout k (its own GPUs)."""
    args = run.args
    if args.colocate or run.engines is None:
        raise ValueError("train_async.py needs separate rollout GPUs: "
                         "drop --colocate, set --rollout-num-gpus")
    assert run.trainer is not None
    ids = list(range(args.start_rollout_id, args.start_rollout_id + args.num_rollout))
    # When each rollout's generation really ended (the worker thread stamps it), not when the
    # loop next looked: a rollout finished before training began must show no overlap.
    generated: dict[int, float] = {}

    def generate(index: int) -> TrainBatch:
        batch = make_batch(run, ids[index])
        generated[index] = time.time()  # before the future resolves, so the loop sees it
        return batch

    def submit(index: int) -> Future[TrainBatch]:
        return pool.submit(generate, index)

    with ThreadPoolExecutor(max_workers=1) as pool:
        pending: Future[TrainBatch] = submit(0)
        for step, rollout_id in enumerate(ids):
            start = time.monotonic()
            batch = pending.result()
            gen_start = time.time()
            if step + 1 < len(ids):
                pending = submit(step + 1)
            version_before = run.trainer.version()
            lag = version_before - batch.weight_version
            if args.ci_test and step > 0:
                inv.check_lag(lag, 1, step)
            row = train_step(run, batch, step)
            if step + 1 < len(ids):
                pending.result()  # refit only once the overlapping rollout has its samples
                gen_end = generated[step + 1]
                row["async/overlap_seconds"] = max(0.0, min(gen_end, row["train/end"]) -
                                                   max(gen_start, row["train/start"]))
            _check(run, row, step, on_policy=lag == 0, untrained=version_before == 0)
            row.update(refit(run, step))
            _finish_row(run, row, batch, step, rollout_id, start, lag)
            ckpt.maybe_save(run, rollout_id, in_flight=int(step + 1 < len(ids)))


def paired_rewards(run: Run) -> list[float] | None:
    """Per-prompt mean reward of the engines' policy now, on every training prompt, with the
    paired evaluation's fixed seeds (`slime.rollout.paired`); None unless asked for."""
    from slime.rollout.paired import prompt_rewards

    k = run.args.ci_paired_eval_samples
    if not k or run.engines is None or run.source is None:
        return None
    return prompt_rewards(run.engines.clients, run.tokenizer, run.source.prompts,
                          _spec(run.args, n=k, temperature=1.0))


def write_paired(run: Run, before: list[float], after: list[float]) -> None:
    """`paired.json`: the reward of the policy before the first step and after the last."""
    from slime.rollout.paired import PairedGain

    gain = PairedGain.of(before, after, run.args.ci_paired_eval_samples)
    (run.out / "paired.json").write_text(json.dumps({**gain.as_dict(), "per_prompt_before": before,
                                                     "per_prompt_after": after}, indent=1))
    print(f"paired: reward {gain.before:.3f} -> {gain.after:.3f} on the same prompts and seeds "
          f"(gain {gain.gain:+.3f} ± {gain.stderr:.3f})", flush=True)


def record_actors(run: Run) -> None:
    """Write `actors.json`: every actor the cluster ran for this job, as Ray's state API lists them.

    Entries read it to prove what ran (e.g. no engine while replaying saved rollouts) from
    the cluster's own records rather than from the loop's word.
    """
    try:
        from ray.util.state import list_actors

        actors = [{"class_name": a.class_name, "state": a.state, "pid": a.pid}
                  for a in list_actors(limit=1000, raise_on_missing_output=False)]
    except Exception as exc:  # the state API is best effort; say why it is missing
        actors = [{"error": str(exc)}]
    (run.out / "actors.json").write_text(json.dumps(actors, indent=1))


def shutdown(run: Run) -> None:
    """End actors, leave the cluster."""
    import ray

    record_actors(run)
    try:
        ckpt.finish(run)
    except Exception as exc:
        print(f"shutdown: the last checkpoint did not complete: {exc}", flush=True)
    for part in (run.trainer, run.engines):
        if part is not None:
            try:
                part.shutdown()
            except Exception as exc:
                print(f"shutdown: {exc}", flush=True)
    ray.shutdown()


def main(argv: list[str], *, asynchronous: bool, env: Mapping[str, str] | None = None) -> int:
    """Parse, run, and turn the expected failures into one line and an exit code."""
    from slime.utils.arguments import ArgumentsError, build_parser, check_training_path

    env = os.environ if env is None else env
    try:
        args = check_training_path(build_parser().parse_args(argv), env)
        if args.debug_train_only and args.load_debug_rollout_data is None:
            raise ArgumentsError("--debug-train-only trains on saved rollouts: add --load-debug-rollout-data")
    except ArgumentsError as exc:
        print(f"error: {exc}", flush=True)
        return 2
    run = None
    try:
        run = setup(args, env)
        before = paired_rewards(run)
        (run_async if asynchronous else run_sync)(run)
        after = paired_rewards(run)
        if before is not None and after is not None:
            write_paired(run, before, after)
    except inv.InvariantViolation as exc:
        print(str(exc), flush=True)
        return inv.EXIT_INVARIANT
    finally:
        if run is not None:
            shutdown(run)
    print(f"done: {args.num_rollout} rollouts; metrics in {run.out / 'metrics.jsonl'}", flush=True)
    return 0
