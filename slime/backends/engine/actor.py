"""`EngineActor`: one engine per Ray actor, holding the GPUs of its placement-group bundle.

The caller places it: `create_engine_actor(..., placement_group=pg, bundle_index=i,
num_gpus=1)` (a fraction when engines share a GPU with trainer ranks). Actors ask for no CPU
(`num_cpus=0`): bundles are GPU-only and the head of a small machine has few CPUs to give.
On CUDA the engine uses the GPU Ray assigned (`CUDA_VISIBLE_DEVICES` is set by Ray); with
`SLIME_CI_DEVICE=cpu` or `SLIME_CI_EMULATE_GPUS=1` it runs on the CPU and still reports the
logical GPU ids Ray gave it (`ray.get_gpu_ids()`), so placement is checkable without GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from slime.backends.engine.server import EngineServer


def engine_device(env: Mapping[str, str]) -> str:
    """"cpu" under `SLIME_CI_DEVICE=cpu` or emulated GPUs, else "cuda" when torch sees one, else "cpu"."""
    chosen = env.get("SLIME_CI_DEVICE", "").strip().lower()
    if chosen not in ("", "cpu", "cuda"):
        raise ValueError(f"SLIME_CI_DEVICE={chosen!r}: use cuda or cpu")
    if chosen == "cpu" or env.get("SLIME_CI_EMULATE_GPUS", "").strip().lower() in ("1", "true", "yes", "on"):
        return "cpu"
    import torch

    if chosen == "cuda" or torch.cuda.is_available():
        return "cuda"
    return "cpu"


class EngineActor:
    """The body of the Ray actor: an `EngineServer` on this actor's device."""

    def __init__(self, model_path: str, *, seed: int = 0, device: str | None = None,
                 host: str = "127.0.0.1", port: int = 0, weight_version: str = "0",
                 max_batch_size: int = 64, batch_delay_s: float = 0.0,
                 labels: Mapping[str, Any] | None = None, weights_dirs: Sequence[str] = ()) -> None:
        import ray

        from slime.ray.placement import bundle_gpu_ids

        self.gpu_ids = [int(g) for g in bundle_gpu_ids()]
        self.node_id = ray.get_runtime_context().get_node_id()
        # Who placed it where (name, model, group, bundle, …): reported back by info().
        self.labels = dict(labels or {})
        self.device = device or engine_device(os.environ)
        self.server = EngineServer(model_path, device=self.device, seed=seed, host=host, port=port,
                                   weight_version=weight_version, max_batch_size=max_batch_size,
                                   batch_delay_s=batch_delay_s, weights_dirs=weights_dirs,
                                   gpu_ids=self.gpu_ids)

    def start(self) -> str:
        """Load the model and serve; returns the URL."""
        return self.server.start()

    def info(self) -> dict[str, Any]:
        """The engine's state (device, gpu_ids, pid, model_bytes, weight_version, …) and its URL."""
        engine = self.server.engine
        base = engine.info() if engine is not None else {"device": self.device, "gpu_ids": self.gpu_ids,
                                                        "pid": os.getpid()}
        return {**base, **self.labels, "node_id": self.node_id,
                "url": self.server.url if engine is not None else None,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def stop(self) -> None:
        """Stop serving and free the model (the actor itself ends with `ray.kill`)."""
        self.server.stop()


def create_engine_actor(model_path: str, *, num_gpus: float = 1, seed: int = 0, placement_group: Any = None,
                        bundle_index: int | None = None, device: str | None = None,
                        weight_version: str = "0", max_batch_size: int = 64, host: str = "127.0.0.1",
                        runtime_env: Mapping[str, Any] | None = None,
                        weights_dirs: Sequence[str] = ()) -> Any:
    """A Ray actor handle running `EngineActor` (call `.start.remote()` to get its URL)."""
    import ray

    options: dict[str, Any] = {"num_cpus": 0, "num_gpus": num_gpus}
    if placement_group is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=placement_group, placement_group_bundle_index=bundle_index
            if bundle_index is not None else -1)
    if runtime_env is not None:
        options["runtime_env"] = dict(runtime_env)
    return ray.remote(EngineActor).options(**options).remote(
        model_path, seed=seed, device=device, host=host, weight_version=weight_version,
        max_batch_size=max_batch_size, weights_dirs=tuple(weights_dirs))
