"""Weights on the wire and on disk: what `/update_weights_from_tensor` carries, what a refit reads.

`serialized_named_tensors` of `/update_weights_from_tensor` is a list of strings, each the
base64 of a safetensors file (`safetensors.torch.save`) mapping parameter names (as in the
model's `state_dict()`) to tensors; `load_format` is `"safetensors_base64"`. (SGLang's own
format pickles CUDA IPC handles, usable only on the same machine and framework; this one is
portable and self-describing.)
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import Path

import torch

TENSOR_FORMAT = "safetensors_base64"


def serialize_named_tensors(named: Mapping[str, torch.Tensor]) -> str:
    """base64 text of a safetensors payload holding `named` (moved to CPU, made contiguous)."""
    from safetensors.torch import save

    payload = {name: t.detach().to("cpu").contiguous() for name, t in named.items()}
    return base64.b64encode(save(payload)).decode("ascii")


def deserialize_named_tensors(text: str) -> dict[str, torch.Tensor]:
    """The tensors of one `serialize_named_tensors` string (ValueError when it is not one)."""
    from safetensors.torch import load

    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        return load(raw)
    except Exception as exc:  # binascii.Error, safetensors' own error types
        raise ValueError(f"not a base64 safetensors payload: {exc}") from None


def read_checkpoint(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face model directory (`model.safetensors` or a sharded index)."""
    from safetensors.torch import load_file

    root = Path(model_dir)
    if not root.is_dir():
        raise ValueError(f"{root}: no such model directory")
    index = root / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (root / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ValueError(f"{root}: no model.safetensors or model.safetensors.index.json")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        tensors.update(load_file(str(root / name)))
    return tensors


def check_named_tensors(named: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], *,
                        complete: bool) -> None:
    """Raise ValueError unless every name is known with the same shape (and, if `complete`, all present)."""
    unknown = sorted(set(named) - set(expected))
    if unknown:
        raise ValueError(f"unknown parameter names: {_some(unknown)}")
    if complete:
        missing = sorted(set(expected) - set(named))
        if missing:
            raise ValueError(f"missing parameters: {_some(missing)}")
    for name, t in named.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            raise ValueError(f"{name}: shape {tuple(t.shape)} does not match the model's "
                             f"{tuple(expected[name].shape)}")


def _some(names: list[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (" …" if len(names) > limit else "")
