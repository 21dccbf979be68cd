"""Save a state dict as HF-style sharded safetensors (`model.safetensors.index.json`) and load it back."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

INDEX_NAME = "model.safetensors.index.json"
_SIZE = re.compile(r"(?i)\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|kib|mib|gib)?\s*")
_UNITS = {
    None: 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9,
    "kib": 2**10, "mib": 2**20, "gib": 2**30,
}


def parse_size(size: int | str) -> int:
    """Bytes in `size`: an int, or text like `"5GB"`, `"500MiB"`."""
    if isinstance(size, int):
        value = size
    else:
        match = _SIZE.fullmatch(size)
        if not match:
            raise ValueError(f"cannot read size {size!r}; write e.g. '5GB' or '512MiB'")
        unit = match.group(2).lower() if match.group(2) else None
        value = int(float(match.group(1)) * _UNITS[unit])
    if value < 1:
        raise ValueError(f"shard size must be positive, got {size!r}")
    return value


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def plan_shards(state_dict: dict[str, torch.Tensor], max_shard_size: int) -> list[list[str]]:
    """Tensor names per shard, in order; a shard exceeds the limit only to hold one oversized tensor."""
    shards: list[list[str]] = []
    current: list[str] = []
    size = 0
    for name, tensor in state_dict.items():
        n = _nbytes(tensor)
        if current and size + n > max_shard_size:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += n
    if current:
        shards.append(current)
    return shards


def save_hf_checkpoint(
    state_dict: dict[str, torch.Tensor],
    out_dir: str | os.PathLike[str],
    *,
    max_shard_size: int | str = "5GB",
    metadata: dict[str, str] | None = None,
) -> Path:
    """Write shards `model-0000i-of-0000n.safetensors` and the index; returns the index path."""
    from safetensors.torch import save_file

    if not state_dict:
        raise ValueError("refusing to save an empty state dict")
    limit = parse_size(max_shard_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards = plan_shards(state_dict, limit)
    weight_map: dict[str, str] = {}
    total = 0
    for i, names in enumerate(shards, start=1):
        filename = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        # safetensors refuses tensors sharing storage (tied weights) and views; own copies are safe.
        tensors = {n: state_dict[n].detach().cpu().contiguous().clone() for n in names}
        save_file(tensors, str(out / filename), metadata={"format": "pt", **(metadata or {})})
        for n in names:
            weight_map[n] = filename
            total += _nbytes(state_dict[n])
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    index_path = out / INDEX_NAME
    # Written last, through a rename: a reader never sees an index naming missing shards.
    tmp = index_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(index, indent=2) + "\n")
    tmp.replace(index_path)
    return index_path


def load_hf_checkpoint(ckpt_dir: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of a sharded (indexed) or single-file safetensors checkpoint."""
    from safetensors.torch import load_file

    d = Path(ckpt_dir)
    index_path = d / INDEX_NAME
    if index_path.is_file():
        weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
        out: dict[str, torch.Tensor] = {}
        for filename in sorted(set(weight_map.values())):
            out.update(load_file(str(d / filename)))
        missing = set(weight_map) - set(out)
        if missing:
            raise ValueError(f"{index_path} names tensors no shard holds: {sorted(missing)[:5]}")
        return out
    single = d / "model.safetensors"
    if single.is_file():
        return load_file(str(single))
    raise FileNotFoundError(f"{d} holds neither {INDEX_NAME} nor model.safetensors")
