"""Convert a Hugging Face model directory to the trainer's distributed checkpoint (DCP), and back.

Forward (what `U.convert_checkpoint` runs under torchrun)::

    torchrun --nproc-per-node N tools/convert_hf_to_torch_dist.py \\
        --model-type qwen2.5-0.5B --hf-checkpoint HF_DIR --save OUT_DIR

Each rank loads the model, shards it with FSDP2 over the N ranks and writes its
own shards as step 0 of the trainer's layout (`OUT_DIR/iter_0000000`), so
`--load OUT_DIR` in training reads it like any checkpoint. The marker
`latest_checkpointed_iteration.txt` is written last: a conversion cut short is
redone, never trusted.

Reverse::

    torchrun --nproc-per-node N tools/convert_hf_to_torch_dist.py --reverse \\
        --load CKPT_DIR [--ckpt-step K] --hf-checkpoint HF_DIR --save OUT_HF_DIR

reads a (converted or trained) checkpoint on any number of ranks (DCP reshards),
gathers full weights on rank 0 and writes safetensors with HF_DIR's config and
tokenizer files. Converting forward then back gives the original tensors exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

# Runnable as `python tools/x.py` from anywhere: the repository root holds `slime`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slime.backends.fsdp import checkpoint as ck
from slime.backends.fsdp.parallel import Layout, build_mesh, parallelize

CONVERTED = "converted.json"
# Files of an HF model directory that are not weights: copied as they are on the way back.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _init() -> tuple[int, int]:
    if "RANK" not in os.environ:  # plain `python tools/...`: one rank
        rendezvous = Path(tempfile.mkdtemp()) / "init"  # a file, not a port: nothing to collide with
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)
    else:
        if os.environ.get("MASTER_ADDR") in ("127.0.0.1", "localhost"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is local
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def _device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _sharded(model: torch.nn.Module, world: int) -> torch.nn.Module:
    if _device_type() == "cuda":
        model = model.cuda()
    return parallelize(model, build_mesh(Layout(dp=world), _device_type()))


def forward(args: argparse.Namespace) -> None:
    from transformers import AutoModelForCausalLM

    rank, world = _init()
    src, out = Path(args.hf_checkpoint), Path(args.save)
    # Keep the stored dtype: the round trip is exact only if nothing is cast.
    model = AutoModelForCausalLM.from_pretrained(src, torch_dtype="auto")
    model = _sharded(model, world)
    if rank == 0:
        ck.step_dir(out, 0).mkdir(parents=True, exist_ok=True)
        (ck.step_dir(out, 0) / CONVERTED).write_text(json.dumps(
            {"hf_checkpoint": str(src.resolve()), "model_type": args.model_type, "ranks": world}, indent=1))
    # Shards from every rank, then the marker: the step exists only once complete.
    ck.Checkpointer(out, save_optimizer=None).save(ck.TrainState(step=0), model)
    if rank == 0:
        print(f"converted {src} -> {out} on {world} ranks", flush=True)
    dist.destroy_process_group()


def reverse(args: argparse.Namespace) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    # Before any process group or model: a wrong --load fails in a second, on every rank.
    if ck.resolve_step(args.load, args.ckpt_step) is None:
        raise SystemExit(f"error: {args.load} holds no complete checkpoint; convert or train into it first")
    rank, world = _init()
    template, out = Path(args.hf_checkpoint), Path(args.save)
    config = AutoConfig.from_pretrained(template)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=config.torch_dtype or torch.float32)
    model = _sharded(model, world)
    state = ck.load(args.load, model, step=args.ckpt_step, load_optimizer=None, load_rng=False)
    assert state is not None
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        plain = AutoModelForCausalLM.from_config(config, torch_dtype=config.torch_dtype or torch.float32)
        plain.load_state_dict(full)
        plain.save_pretrained(out, safe_serialization=True)
        for f in template.iterdir():
            keep = f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and f.name not in _WEIGHT_INDEXES
            if keep and not (out / f.name).exists():
                shutil.copy2(f, out / f.name)
        print(f"converted {args.load} step {state.step} -> {out} on {world} ranks", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reverse", action="store_true", help="checkpoint -> Hugging Face directory")
    p.add_argument("--model-type", default="", help="recorded with the conversion (e.g. qwen2.5-0.5B)")
    p.add_argument("--hf-checkpoint", required=True,
                   help="HF model directory (forward: source; reverse: config and tokenizer template)")
    p.add_argument("--save", required=True, help="output directory")
    p.add_argument("--load", help="reverse: the checkpoint root to read")
    p.add_argument("--ckpt-step", type=int, default=None, help="reverse: step to read (default: latest)")
    args = p.parse_args(argv)
    if args.reverse and not args.load:
        p.error("--reverse needs --load CKPT_DIR")
    try:
        (reverse if args.reverse else forward)(args)
    except ck.CheckpointError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
