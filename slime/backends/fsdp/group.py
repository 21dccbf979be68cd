"""The trainer as a Ray actor group: one `TrainRank` per placement-group bundle."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

from slime.backends.fsdp.config import TrainerConfig
from slime.ray.placement import Placement, actor_options, compute_device


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rendezvous(env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """MASTER_ADDR / MASTER_PORT as the job's env gives them (U reserves the port), else a free one."""
    env = os.environ if env is None else env
    addr = env.get("MASTER_ADDR") or "127.0.0.1"
    port = env.get("MASTER_PORT")
    return addr, int(port) if port else _free_port()


class TrainGroup:
    """Start the ranks on their bundles, then call each method on all of them at once."""

    def __init__(self, pg: Any, layout: Placement, config: TrainerConfig, *,
                 env: Mapping[str, str] | None = None) -> None:
        import ray

        from slime.backends.fsdp.rank import TrainRank

        addr, port = rendezvous(env)
        device = compute_device(env)
        actor_cls = ray.remote(TrainRank)
        self.actors = [
            actor_cls.options(**actor_options(pg, bundle, layout.trainer_gpus)).remote(  # type: ignore[attr-defined]
                rank=rank, world_size=layout.world_size, master_addr=addr, master_port=port,
                config=config, device=device,
            )
            for rank, bundle in enumerate(layout.trainer_bundles)
        ]
        self.world_size = layout.world_size
        # Construction runs init_process_group: wait until every rank has joined.
        ray.get([a.get_version.remote() for a in self.actors])

    def _all(self, method: str, *args: Any) -> list[Any]:
        import ray

        return ray.get([getattr(a, method).remote(*args) for a in self.actors])

    def train_async(self, batch: Any) -> list[Any]:
        """Start one step on every rank; returns the Ray refs (rank 0's result is the merge)."""
        import ray

        ref = ray.put(batch)
        return [a.train.remote(ref) for a in self.actors]

    def train(self, batch: Any) -> dict[str, float]:
        """One optimiser step on every rank; the metrics merged over ranks."""
        import ray

        results: list[dict[str, float]] = ray.get(self.train_async(batch))
        return results[0]

    def export_hf(self, out_dir: str) -> str:
        """Write the current policy as an HF directory (rank 0 writes, all ranks gather)."""
        paths = self._all("export_hf", out_dir)
        return str(paths[0])

    def full_state_dict(self) -> dict[str, Any]:
        """The whole policy, gathered onto rank 0 and returned."""
        state: dict[str, Any] = self._all("full_state_dict")[0]
        return state

    def save_checkpoint(self, root: str, rollout_id: int, data_cursor: int, *, save_optimizer: str,
                        async_save: bool) -> None:
        """Save on every rank (returns before the write ends with async_save)."""
        import ray

        ray.get([a.save_checkpoint.remote(root, rollout_id, data_cursor, save_optimizer=save_optimizer,
                                          async_save=async_save) for a in self.actors])

    def wait_checkpoint(self) -> None:
        """Wait for a background save on every rank."""
        self._all("wait_checkpoint")

    def load_checkpoint(self, root: str, step: int | None, load_optimizer: str | None,
                        load_rng: bool = True) -> dict[str, int] | None:
        """Restore every rank; the saved train state (equal on all ranks), or None."""
        states = self._all("load_checkpoint", root, step, load_optimizer, load_rng)
        return states[0]  # type: ignore[no-any-return]

    def version(self) -> int:
        """Optimiser steps taken (equal on every rank)."""
        versions = set(self._all("get_version"))
        if len(versions) != 1:
            raise RuntimeError(f"trainer ranks disagree on their weight version: {sorted(versions)}")
        return versions.pop()

    def pids(self) -> list[int]:
        """Process ids of the ranks."""
        return list(self._all("pid"))

    def shutdown(self) -> None:
        """Leave the process group and end the actors."""
        import ray

        try:
            # Two rounds: every rank finishes what it was doing (its last step's collectives,
            # a background save) before any rank leaves the group. A rank that destroyed it
            # straight after its own last collective returned would hang up on a peer still
            # completing that collective, or still writing its save.
            self._all("wait_checkpoint")
            self._all("shutdown")
        finally:
            for a in self.actors:
                ray.kill(a)
