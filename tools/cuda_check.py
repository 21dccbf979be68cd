"""Prove the training path on one device, in one process: `python tools/cuda_check.py [--device cuda|cpu]`.

Needs only torch, transformers, tokenizers (and safetensors, which transformers brings) and this
repository: no Ray, no SGLang, no Docker, no network. It builds the tiny model and runs five
checks on the device, prints one table and, with `--json OUT`, writes every figure:

1. the engine (`Engine`, what the HTTP server wraps) samples a batch with its KV cache in fp32
   and in bf16; the trainer's forward on the same tokens gives the same log-probs (max and mean
   gap against `--ci-test`'s `--ci-logprob-tol` for fp32, against `--bf16-logprob-tol` for bf16);
2. GRPO steps of the FSDP2 trainer at world size 1 through the RL loop's own functions
   (`--colocate --ci-test --ci-sleep-check`, tensor refit): every invariant holds, engines serve
   each new version, the first step follows the policy gradient; rewards before and after;
3. sleep / wake: the bytes the engine holds (`torch.cuda.memory_allocated` on CUDA) before, while
   released and after resume; the same seeded generations before and after;
4. a DCP checkpoint saved mid-run and resumed: the rest of the run equals the uninterrupted one
   (bitwise on CPU; on CUDA, deterministic kernels on and `--resume-atol`, the note says which);
5. timings: generation tokens/s, training steps/s, peak memory.

Exit status: 0 every check held, 1 a check failed (the table says which and why), 2 bad input
(such as `--device cuda` where torch sees no CUDA device, or a missing package), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

# Runnable as `python tools/cuda_check.py` from anywhere: the repository root holds `slime`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
# On CUDA a resumed run may differ in the last bits where a kernel has no deterministic variant.
CUDA_RESUME_ATOL = 1e-5
CUDA_PROBE_LOGPROB_TOL = 1e-6


if TYPE_CHECKING:
    from slime.device_check.judge import Limits


class BadInput(Exception):
    """An option this run cannot use; the message says what to pass instead."""


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cuda_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="where the engine and the trainer run (default cuda)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="write verdicts and figures here")
    p.add_argument("--steps", type=int, default=4, help="GRPO steps (>= 2; resumed from the middle one)")
    p.add_argument("--prompts", type=int, default=16, help="prompts per rollout")
    p.add_argument("--samples-per-prompt", type=int, default=4)
    p.add_argument("--warmup-steps", type=int, default=200,
                   help="supervised steps before RL, so the reward starts between 0 and 1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16-logprob-tol", type=float, default=None,
                   help="max per-token |engine - trainer| log-prob in bf16 (default 0.15)")
    p.add_argument("--bf16-logprob-mean-tol", type=float, default=None, help="mean of it (default 0.02)")
    p.add_argument("--resume-atol", type=float, default=None,
                   help=f"resume vs the uninterrupted run (default 0, bitwise, on CPU; "
                        f"{CUDA_RESUME_ATOL:g} on CUDA)")
    p.add_argument("--min-tokens-per-s", type=float, default=0.0, help="fail below this generation speed")
    p.add_argument("--min-steps-per-s", type=float, default=0.0, help="fail below this training speed")
    p.add_argument("--dry-run", action="store_true",
                   help="print the device, sizes and tolerances this run would use, and stop")
    return p.parse_args(argv)


def check_input(args: argparse.Namespace) -> None:
    if args.steps < 2:
        raise BadInput(f"--steps {args.steps}: at least 2 (one before the checkpoint, one after it)")
    for name in ("prompts", "samples_per_prompt"):
        if getattr(args, name) < 1:
            raise BadInput(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.samples_per_prompt < 2:
        raise BadInput("--samples-per-prompt must be >= 2: GRPO compares samples of one prompt")
    if args.warmup_steps < 0:
        raise BadInput(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    for name in ("bf16_logprob_tol", "bf16_logprob_mean_tol", "resume_atol"):
        value = getattr(args, name)
        if value is not None and not value >= 0:
            raise BadInput(f"--{name.replace('_', '-')} must be >= 0, got {value}")
    if args.json is not None and args.json.is_dir():
        raise BadInput(f"--json {args.json} is a directory; name a file")
    import torch  # last: a mistyped option is answered without the seconds torch takes to import

    if args.device == "cuda" and not torch.cuda.is_available():
        raise BadInput(f"--device cuda: torch {torch.__version__} sees no CUDA device "
                       f"(built for CUDA {torch.version.cuda}); run on a GPU machine or pass --device cpu")


def limits_for(args: argparse.Namespace, fp32_tol: float) -> Limits:

    from slime.device_check.judge import Limits

    cuda = args.device == "cuda"
    extra = {k: v for k, v in (("bf16_logprob_max", args.bf16_logprob_tol),
                               ("bf16_logprob_mean", args.bf16_logprob_mean_tol)) if v is not None}
    return Limits(fp32_logprob=fp32_tol, probe_logprob=CUDA_PROBE_LOGPROB_TOL if cuda else 0.0,
                  resume_atol=args.resume_atol if args.resume_atol is not None
                  else (CUDA_RESUME_ATOL if cuda else 0.0),
                  min_tokens_per_s=args.min_tokens_per_s, min_steps_per_s=args.min_steps_per_s, **extra)


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        check_input(args)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from transformers.utils import logging as hf_logging

        from slime.device_check import judge, measure, report
        from slime.utils.arguments import build_parser
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except ImportError as exc:
        print(f"error: cannot import {exc.name or exc}; cuda_check needs torch, transformers, tokenizers "
              "and safetensors in this Python", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    measure.prepare_process(args.device)
    opts = measure.Options(device=args.device, steps=args.steps, prompts=args.prompts,
                           samples_per_prompt=args.samples_per_prompt, warmup_steps=args.warmup_steps,
                           seed=args.seed)
    # fp32 is held to exactly what --ci-test allows a training run: the trainer parser's default.
    fp32_tol = build_parser().get_default("ci_logprob_tol")
    limits = limits_for(args, fp32_tol)
    if args.dry_run:
        print(f"would run on {args.device} (process group {'nccl' if args.device == 'cuda' else 'gloo'}, "
              f"world size 1): {opts}", flush=True)
        print(f"tolerances: {limits}", flush=True)
        return EXIT_OK
    start = time.perf_counter()
    figures = measure.measure(opts)
    figures["total_seconds"] = time.perf_counter() - start
    verdicts = judge.judge_all(figures, limits, device=args.device, steps=args.steps)
    print(report.table(verdicts, figures.get("env", {})), flush=True)
    print(f"total {figures['total_seconds']:.1f} s", flush=True)
    if args.json is not None:
        options = {**vars(opts), "limits": vars(limits)}
        report.write_json(args.json, report.document(verdicts, figures, options))
    return EXIT_OK if all(v.ok for v in verdicts) else EXIT_FAILED


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
