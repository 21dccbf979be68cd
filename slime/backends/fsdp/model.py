"""The models a rank holds: the policy (an HF causal LM), its frozen reference, a critic.

`shard_model` is the one place that decides how a model is wrapped for parallelism
(FSDP2 over the data-parallel ranks today); tensor parallel goes there too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def load_causal_lm(path: str, device: str) -> nn.Module:
    """An HF causal LM in float32 from a local directory (no hub access)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    return model.to(device)


class ValueModel(nn.Module):
    """The critic: the policy's backbone with a scalar head on every position."""

    def __init__(self, path: str, device: str) -> None:
        super().__init__()
        from transformers import AutoModel

        self.backbone = AutoModel.from_pretrained(path, dtype=torch.float32, local_files_only=True)
        hidden = int(self.backbone.config.hidden_size)
        self.head = nn.Linear(hidden, 1)
        # A zero head starts every value at 0: the first advantages are the plain returns.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.to(device)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        # A copy, not the squeezed view: FSDP2 hangs its pre-backward hook on the output,
        # and an in-place op on a view would drop it (FSDP2 warns about a view output).
        values: torch.Tensor = self.head(hidden).squeeze(-1).clone()
        return values


def _blocks(model: nn.Module) -> list[nn.Module]:
    # HF decoders keep their transformer blocks in one ModuleList named `layers` (or `h`).
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h"):
            return list(module)
    return []


def shard_model(model: nn.Module, *, world_size: int, mesh: Any = None) -> nn.Module:
    """Wrap `model` for data parallelism: FSDP2 per transformer block, then the root.

    Each block is its own unit so its parameters are gathered just before use and freed
    after; the root unit holds the embeddings and head.
    """
    from torch.distributed.fsdp import fully_shard

    del world_size  # every rank shards over the default group (one data-parallel mesh)
    for block in _blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
