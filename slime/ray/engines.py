"""Rollout engines as Ray actors on their bundles, and HTTP clients to reach them.

Each engine is an `EngineActor` (`slime.backends.engine`) serving SGLang's native API from
its bundle's GPU (half of it when colocated). The loop talks to engines only through
`EngineClient`, so a real SGLang server could stand where our engine does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slime.ray.placement import Layout, actor_options, compute_device


def engine_actor_class(backend: str) -> type:
    """The actor class of `--rollout-backend`: our engine, or a real SGLang server."""
    if backend == "sglang":
        from slime.backends.engine.sglang_backend import SGLangActor

        return SGLangActor
    if backend == "slime":
        from slime.backends.engine.actor import EngineActor

        return EngineActor
    raise ValueError(f"--rollout-backend {backend!r}: choose slime or sglang")


class EngineGroup:
    """Start one engine per engine bundle; `clients` talk to them over HTTP."""

    def __init__(self, pg: Any, layout: Layout, model_path: str, *, seed: int,
                 env: Mapping[str, str] | None = None, backend: str = "slime") -> None:
        import ray

        from slime.backends.engine.client import EngineClient

        device = compute_device(env)
        engine_cls = engine_actor_class(backend)
        actor_cls = ray.remote(engine_cls) if not hasattr(engine_cls, "remote") else engine_cls
        self.actors = [
            actor_cls.options(**actor_options(pg, bundle, layout.engine_gpus)).remote(
                model_path, device=device, seed=seed + i)
            for i, bundle in enumerate(layout.engine_bundles)
        ]
        self.urls: list[str] = ray.get([a.start.remote() for a in self.actors])
        self.clients = [EngineClient(url) for url in self.urls]
        for client in self.clients:
            client.wait_healthy(timeout=300)

    def versions(self) -> dict[str, str]:
        """URL → weight version each engine reports."""
        return {c.url: c.weight_version() for c in self.clients}

    def info(self) -> list[dict[str, Any]]:
        """`/get_server_info` of every engine (device, pid, model bytes, …)."""
        return [c.server_info() for c in self.clients]

    def release(self) -> None:
        """Free every engine's weights and cache (colocated: the trainer steps meanwhile)."""
        for c in self.clients:
            c.release_memory_occupation()

    def resume(self) -> None:
        """Bring the engines' memory back."""
        for c in self.clients:
            c.resume_memory_occupation()

    def refit_from_disk(self, path: str, version: int) -> None:
        """Every engine loads the HF directory `path` as weight version `version`."""
        for c in self.clients:
            c.update_weights_from_disk(path, weight_version=str(version))

    def refit_from_tensors(self, state: Mapping[str, Any], version: int) -> None:
        """Every engine takes the named tensors as weight version `version`."""
        for c in self.clients:
            c.update_weights_from_tensor(state, weight_version=str(version))

    def shutdown(self) -> None:
        """Stop the servers and end the actors."""
        import ray

        try:
            ray.get([a.stop.remote() for a in self.actors], timeout=60)
        finally:
            for a in self.actors:
                ray.kill(a)
