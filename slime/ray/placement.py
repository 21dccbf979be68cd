"""One placement group of NUM_GPUS GPU bundles, and which bundle each trainer rank and engine gets.

Bundles hold only `{"GPU": 1}`; every actor asks for `num_cpus=0` because the CI head may
have two CPUs while it emulates eight GPUs. Colocated, a trainer rank and an engine share a
bundle (half a GPU each); disaggregated, the first bundles go to the trainer and the last
`rollout_num_gpus` to the engines. The same code runs on CUDA and under emulation, where the
head's GPUs are logical (`ray start --num-gpus N`) and the ranks compute on the CPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Colocated actors split one bundle; the two halves sum to exactly the bundle's one GPU.
COLOCATED_FRACTION = 0.5


class PlacementError(ValueError):
    """A GPU layout that cannot be placed; the message says which flag to change."""


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Bundle indices per trainer rank and per engine, and each actor's share of its GPU."""

    num_gpus: int
    colocate: bool
    trainer_bundles: tuple[int, ...]
    engine_bundles: tuple[int, ...]
    trainer_gpus: float  # num_gpus each trainer actor requests
    engine_gpus: float

    @property
    def world_size(self) -> int:
        """Trainer ranks."""
        return len(self.trainer_bundles)


def plan_layout(num_gpus: int, *, colocate: bool, rollout_num_gpus: int | None = None,
                trainer_num_gpus: int | None = None) -> Placement:
    """Assign bundles (pure). Colocated: every bundle holds a rank and an engine."""
    if num_gpus < 1:
        raise PlacementError(f"the placement group needs at least one GPU, got {num_gpus}")
    if colocate:
        if rollout_num_gpus not in (None, num_gpus):
            raise PlacementError(
                f"--colocate shares all {num_gpus} GPUs; drop --rollout-num-gpus {rollout_num_gpus}"
            )
        bundles = tuple(range(num_gpus))
        return Placement(num_gpus=num_gpus, colocate=True, trainer_bundles=bundles,
                      engine_bundles=bundles, trainer_gpus=COLOCATED_FRACTION,
                      engine_gpus=1 - COLOCATED_FRACTION)
    if rollout_num_gpus is None or not 1 <= rollout_num_gpus < num_gpus:
        raise PlacementError(
            f"without --colocate, --rollout-num-gpus must leave the trainer at least one of the "
            f"{num_gpus} GPUs and give the engines at least one (got {rollout_num_gpus})"
        )
    train = num_gpus - rollout_num_gpus if trainer_num_gpus is None else trainer_num_gpus
    if train < 1 or train + rollout_num_gpus > num_gpus:
        raise PlacementError(
            f"trainer {train} + rollout {rollout_num_gpus} GPUs do not fit in {num_gpus}"
        )
    return Placement(num_gpus=num_gpus, colocate=False, trainer_bundles=tuple(range(train)),
                  engine_bundles=tuple(range(train, train + rollout_num_gpus)),
                  trainer_gpus=1.0, engine_gpus=1.0)


def bundles(num_gpus: int) -> list[dict[str, float]]:
    """The placement group's bundles: one GPU each, no CPU."""
    return [{"GPU": 1.0} for _ in range(num_gpus)]


def create_placement_group(num_gpus: int, *, timeout: float = 120.0) -> Any:
    """Reserve `num_gpus` GPU bundles packed on as few nodes as possible; wait until they are."""
    import ray
    from ray.util.placement_group import placement_group

    pg = placement_group(bundles(num_gpus), strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=timeout)
    if not ready:
        total = ray.cluster_resources().get("GPU", 0)
        raise PlacementError(
            f"{num_gpus} GPU bundles not placed within {timeout:.0f} s; the cluster has {total:g} "
            "GPUs (start the head with --num-gpus, or lower NUM_GPUS)"
        )
    return pg


def actor_options(pg: Any, bundle: int, gpus: float, *,
                  env_vars: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Ray `.options(...)` pinning an actor to one bundle with a share of its GPU and no CPU."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    options: dict[str, Any] = {
        "num_cpus": 0,
        "num_gpus": gpus,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=bundle,
        ),
    }
    if env_vars:
        options["runtime_env"] = {"env_vars": dict(env_vars)}
    return options


def compute_device(env: Mapping[str, str] | None = None) -> str:
    """"cuda" or "cpu" for a rank or engine: SLIME_CI_DEVICE when set, else what torch sees."""
    env = os.environ if env is None else env
    chosen = env.get("SLIME_CI_DEVICE", "").strip().lower()
    if chosen == "cpu" or env.get("SLIME_CI_EMULATE_GPUS") == "1":
        return "cpu"
    import torch

    if chosen == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("SLIME_CI_DEVICE=cuda but this process sees no CUDA device")
    return "cuda" if torch.cuda.is_available() else "cpu"


def bundle_gpu_ids() -> list[str]:
    """The GPU ids Ray gave the calling actor (logical ones under emulation).

    `ray.get_gpu_ids()` maps Ray's slots through the worker's CUDA_VISIBLE_DEVICES, which
    emulation sets to "" so that no rank touches a real GPU; it then returns nothing. The
    slots themselves are still what Ray assigned, so they are read from the worker then.
    """
    import ray

    ids = [str(i) for i in ray.get_gpu_ids()]
    if ids or os.environ.get("CUDA_VISIBLE_DEVICES") != "":
        return ids
    try:
        assigned = ray._private.worker.global_worker.core_worker.resource_ids()
    except AttributeError:  # a Ray without it: say nothing rather than guess
        return []
    return sorted({str(slot) for name, pairs in assigned.items()
                   if name == "GPU" or name.startswith("GPU_group_")
                   for slot, _ in pairs}, key=int)
