"""Data parallel (FSDP2) × tensor parallel (DTensor) layouts for Qwen2/Llama-style models.

`build_mesh` makes a ("dp", "tp") device mesh; `parallelize` splits each decoder
block's projections over "tp" (q/k/v and gate/up column-wise, o and down row-wise,
so each block needs two all-reduces and attention runs on whole heads per rank),
then shards every block and the root with `fully_shard` over "dp". Both work on
gloo/CPU as on NCCL/CUDA.

The loss normalisation that makes gradients independent of the layout lives here
too (`normalise_loss`): a layout changes how tokens are split across ranks and
micro-batches, and the sum over all of them must be divided by a *global* count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class LayoutError(ValueError):
    """A parallel layout that does not fit the world or the model; the message says what to change."""


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How many ranks split the batch (dp) and each layer (tp)."""

    dp: int
    tp: int = 1

    @property
    def world_size(self) -> int:
        return self.dp * self.tp


def layout_for(world_size: int, tp: int) -> Layout:
    """The layout of `world_size` ranks with tensor-parallel size `tp` (the rest is data parallel)."""
    if tp < 1 or world_size % tp:
        raise LayoutError(f"tensor-parallel size {tp} does not divide the {world_size} ranks; "
                          f"pick a divisor of {world_size}")
    return Layout(dp=world_size // tp, tp=tp)


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """A 2-D ("dp", "tp") mesh over all ranks of the default group."""
    world = dist.get_world_size()
    if layout.world_size != world:
        raise LayoutError(f"layout dp={layout.dp} × tp={layout.tp} needs {layout.world_size} ranks, "
                          f"the group has {world}")
    return init_device_mesh(device_type, (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))


def check_tp_fits(config: object, tp: int) -> None:
    """Heads, KV heads and the MLP width must split evenly over tp ranks."""
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, name)
        if value % tp:
            raise LayoutError(f"model {name} = {value} does not split over tensor-parallel size {tp}; "
                              f"pick a tp that divides it")


_BLOCK_PLAN = {
    # Column-wise splits the output features, i.e. whole heads per rank; HF's
    # attention reshapes with -1 heads, so each rank runs num_heads / tp heads
    # and num_kv_heads / tp KV heads (the GQA group size is unchanged).
    "self_attn.q_proj": "col",
    "self_attn.k_proj": "col",
    "self_attn.v_proj": "col",
    "self_attn.o_proj": "row",
    "mlp.gate_proj": "col",
    "mlp.up_proj": "col",
    "mlp.down_proj": "row",
}


def parallelize(model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    """Tensor-parallel blocks over mesh["tp"], then FSDP2 over mesh["dp"]; in place."""
    blocks = _blocks(model)
    tp = mesh["tp"].size()
    if tp > 1:
        check_tp_fits(model.config, tp)
        for block in blocks:
            plan = {name: ColwiseParallel() if kind == "col" else RowwiseParallel()
                    for name, kind in _BLOCK_PLAN.items()}
            parallelize_module(block, mesh["tp"], plan)
    # One FSDP unit per block, so only one block's full weights exist at a time.
    for block in blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def _blocks(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise LayoutError(f"{type(model).__name__} has no .model.layers: only decoder LMs of the "
                          "Qwen2/Llama family can be parallelised here")
    return list(layers)


def micro_batches(rows: int, count: int) -> list[slice]:
    """Split `rows` into `count` contiguous micro-batches, sizes differing by at most one."""
    if count < 1 or count > rows:
        raise LayoutError(f"{count} micro-batches for {rows} rows: use between 1 and {rows}")
    base, extra = divmod(rows, count)
    out, start = [], 0
    for i in range(count):
        size = base + (i < extra)
        out.append(slice(start, start + size))
        start += size
    return out


def normalise_loss(
    token_loss: torch.Tensor,
    mask: torch.Tensor,
    *,
    per_token: bool,
    global_tokens: int,
    global_samples: int,
    dp_size: int,
    wrong_normalisation: bool = False,
) -> torch.Tensor:
    """This micro-batch's share of the global loss, scaled for FSDP's mean over dp ranks.

    per_token: sum of all masked token losses / tokens in the global batch.
    Otherwise: mean over samples of each sample's token mean.
    Summed over micro-batches and averaged over dp (FSDP's reduce), the gradient is
    that of the global loss, whatever the layout.

    `wrong_normalisation` divides by this micro-batch's own count instead (a mean of
    means): a real, common bug, kept so the CI comparison can prove it catches it.
    """
    mask = mask.to(token_loss.dtype)
    if wrong_normalisation:
        local = mask.sum().clamp(min=1.0)
        return (token_loss * mask).sum() / local
    if per_token:
        return (token_loss * mask).sum() / global_tokens * dp_size
    per_sample = (token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_sample.sum() / global_samples * dp_size


def grad_norm(parameters: Iterable[torch.nn.Parameter], group: dist.ProcessGroup | None = None) -> float:
    """The global L2 norm of all gradients, exact for DTensor (FSDP2 / TP) and plain parameters.

    Each rank adds the squares of its local shard; a shard replicated over some mesh
    dimensions (or a plain tensor every rank holds) is counted once by dividing by its
    replica count, then one all-reduce sums over the world.
    """
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    device = torch.device("cpu")
    total = torch.zeros((), dtype=torch.float64)
    for p in parameters:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            mesh = g.device_mesh
            replicas = math.prod(mesh.size(i) for i, pl in enumerate(g.placements) if pl.is_replicate())
            # A mesh smaller than the world is itself repeated world / mesh.size() times.
            replicas *= world // mesh.size()
            local = g.to_local()
        else:
            replicas, local = world, g
        device = local.device
        total += local.detach().double().pow(2).sum().cpu() / replicas
    if world > 1:
        # NCCL reduces device tensors only; gloo takes either.
        total = total.to(device)
        dist.all_reduce(total, group=group)
    return float(total.sqrt())


def clip_grads(parameters: Sequence[torch.nn.Parameter], max_norm: float, norm: float) -> None:
    """Scale gradients so their global norm is at most `max_norm` (norm from `grad_norm`)."""
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for p in parameters:
            if p.grad is not None:
                p.grad.mul_(coef)
