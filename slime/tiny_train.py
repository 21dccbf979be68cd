"""A tiny causal language model trained with plain PyTorch: the honest smoke of the GPU tier.

It runs where the real trainer runs (as a Ray job started by `U.execute_train`), on CUDA
when the entry holds GPUs and on the CPU under emulation, one rank per GPU (DDP over NCCL
or gloo). It imports nothing else from slime, so it runs as a plain script:

    python slime/tiny_train.py --data data.jsonl --steps 40 --save out/ckpt --metrics out/m.json

With `--ci-test` it fails unless the loss fell and the device is the one the runner asked for.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of the tiny model."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int


MODEL_PRESETS: dict[str, ModelConfig] = {
    "tiny-gpt": ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, seq_len=16),
    "tiny-gpt-2l": ModelConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, seq_len=32),
}


class TinyLM(nn.Module):
    """Token and position embeddings, causal transformer layers, tied output head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, dim_feedforward=4 * cfg.d_model,
                                           dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.d_model)
        # Small embeddings keep the tied head's first logits near zero: the first loss is
        # then about ln(vocab), and what follows measures learning, not a bad start.
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        h = self.tok(tokens) + self.pos(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        h = self.blocks(h, mask=mask, is_causal=True)
        logits: torch.Tensor = self.norm(h) @ self.tok.weight.T
        return logits


def make_sequences(n: int, cfg: ModelConfig, *, seed: int) -> list[list[int]]:
    """Sequences that follow a fixed rule (next = 5·x + 3 mod V): learnable in a few steps."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
    out = []
    for x in starts:
        seq = [x]
        for _ in range(cfg.seq_len - 1):
            seq.append((5 * seq[-1] + 3) % cfg.vocab_size)
        out.append(seq)
    return out


def write_dataset(path: Path, n: int, model_type: str, *, seed: int = 0) -> Path:
    """Write `n` training sequences as JSON lines `{"tokens": [...]}`."""
    cfg = MODEL_PRESETS[model_type]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for seq in make_sequences(n, cfg, seed=seed):
            fh.write(json.dumps({"tokens": seq}) + "\n")
    return path


def read_dataset(path: Path, cfg: ModelConfig) -> torch.Tensor:
    rows = [json.loads(line)["tokens"] for line in path.read_text(encoding="utf-8").splitlines() if line]
    if not rows:
        raise SystemExit(f"{path}: no sequences")
    data = torch.tensor(rows, dtype=torch.long)
    if data.shape[1] != cfg.seq_len or int(data.max()) >= cfg.vocab_size:
        raise SystemExit(f"{path}: sequences must have length {cfg.seq_len} and tokens < {cfg.vocab_size}")
    return data


def choose_device(requested: str | None) -> str:
    """The device to train on: as requested, else CUDA when torch sees one."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise SystemExit("SLIME_CI_DEVICE=cuda but torch sees no CUDA device")
    if requested in ("cuda", "cpu"):
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def loss_fell(losses: list[float], *, window: int = 3, ratio: float = 0.7) -> bool:
    """Whether the mean of the last `window` losses is below `ratio` times the first window's."""
    if len(losses) < 2 * window or not all(math.isfinite(x) for x in losses):
        return False
    first = sum(losses[:window]) / window
    last = sum(losses[-window:]) / window
    return last < ratio * first


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, args: argparse.Namespace, device_kind: str) -> None:
    world = args.world_size
    if world > 1:
        backend = "nccl" if device_kind == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world,
                                init_method=f"tcp://{args.master_addr}:{args.master_port}")
    device = torch.device(f"cuda:{rank}" if device_kind == "cuda" else "cpu")
    if device_kind == "cpu" and world > 1:
        # Ranks emulating GPUs share the CPU; one thread each avoids oversubscription.
        torch.set_num_threads(1)
    if device_kind == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    cfg = MODEL_PRESETS[args.model_type]
    core = TinyLM(cfg).to(device)
    if args.load:
        from safetensors.torch import load_file

        core.load_state_dict(load_file(str(Path(args.load) / "model.safetensors"), device=str(device)))
    model: nn.Module = core
    if world > 1:
        ids = [rank] if device_kind == "cuda" else None
        model = nn.parallel.DistributedDataParallel(core, device_ids=ids)
    data = read_dataset(Path(args.data), cfg)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(args.seed + 1)
    losses: list[float] = []
    for step in range(args.steps):
        # Every rank draws the same global batch and trains on its own slice of it.
        batch = data[torch.randint(0, len(data), (args.global_batch_size,), generator=g)]
        local = batch[rank::world].to(device)
        logits = model(local[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), local[:, 1:].reshape(-1))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        value = loss.detach()
        if world > 1:
            dist.all_reduce(value)
            value /= world
        losses.append(float(value))
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step} loss {losses[-1]:.4f}", flush=True)
    if rank == 0:
        _finish(args, cfg, core, losses, device_kind)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def _finish(args: argparse.Namespace, cfg: ModelConfig, model: nn.Module, losses: list[float],
            device_kind: str) -> None:
    result: dict[str, Any] = {
        "model_type": args.model_type, "config": asdict(cfg), "device": device_kind,
        "cuda_device_name": torch.cuda.get_device_name(0) if device_kind == "cuda" else None,
        "world_size": args.world_size, "steps": args.steps, "losses": losses,
        "loss_fell": loss_fell(losses),
    }
    if args.save:
        from safetensors.torch import save_file

        save = Path(args.save)
        save.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(save / "model.safetensors"))
        (save / "config.json").write_text(json.dumps({"model_type": args.model_type, **asdict(cfg)}))
        result["checkpoint"] = str(save)
    if args.metrics:
        Path(args.metrics).parent.mkdir(parents=True, exist_ok=True)
        Path(args.metrics).write_text(json.dumps(result, indent=1))
    print(f"final loss {losses[-1]:.4f} (first {losses[0]:.4f}) on {device_kind} x{args.world_size}",
          flush=True)
    if args.ci_test and not result["loss_fell"]:
        raise SystemExit(f"--ci-test: the loss did not fall: {losses}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line of the tiny trainer; defaults come from the entry's environment."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-type", default="tiny-gpt", choices=sorted(MODEL_PRESETS))
    p.add_argument("--data", required=True, help="JSON lines of {'tokens': [...]} (see write_dataset)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--global-batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--world-size", type=int, default=int(os.environ.get("NUM_GPUS") or 1),
                   help="ranks (one per GPU); default NUM_GPUS")
    p.add_argument("--device", choices=("cuda", "cpu"), default=os.environ.get("SLIME_CI_DEVICE") or None)
    p.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR", "127.0.0.1"))
    p.add_argument("--master-port", type=int, default=int(os.environ.get("MASTER_PORT") or 0))
    p.add_argument("--load", help="directory with model.safetensors to start from")
    p.add_argument("--save", help="directory to write model.safetensors and config.json")
    p.add_argument("--metrics", help="JSON file for losses, device and world size")
    p.add_argument("--ci-test", action="store_true", help="fail unless the loss fell")
    args = p.parse_args(argv)
    if args.world_size < 1 or args.global_batch_size < args.world_size:
        p.error("need --world-size >= 1 and --global-batch-size >= --world-size")
    return args


def main(argv: list[str] | None = None) -> int:
    """Train, save, report; exit non-zero when --ci-test finds the loss did not fall."""
    args = parse_args(argv)
    device_kind = choose_device(args.device)
    if device_kind == "cuda" and torch.cuda.device_count() < args.world_size:
        raise SystemExit(f"{args.world_size} ranks need {args.world_size} GPUs; "
                         f"torch sees {torch.cuda.device_count()}")
    if args.world_size > 1:
        if not args.master_port:
            args.master_port = _free_port()
        mp.spawn(_rank_main, args=(args, device_kind), nprocs=args.world_size, join=True)
    else:
        _rank_main(0, args, device_kind)
    return 0


if __name__ == "__main__":
    sys.exit(main())
