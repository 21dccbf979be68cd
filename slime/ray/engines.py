"""Rollout engines as Ray actors on their bundles, and HTTP clients to reach them.

Each engine is an `EngineActor` (`slime.backends.engine`) serving SGLang's native API from
its bundle's GPU (half of it when colocated). The loop talks to engines only through
`EngineClient`, so a real SGLang server could stand where our engine does.

Which engines start comes from `--sglang-config` (`slime.backends.engine.sglang_config`) or,
without one, one updatable engine per rollout bundle. Rollout GPU `i` of the config is engine
bundle `layout.engine_bundles[i]`; an engine of several GPUs is placed on the bundle of its
first one and the bundles of the others are left to it (our engine computes on one device;
a real SGLang server spreads its tensor-parallel ranks over them).

Updatable engines generate the rollouts and are refit after every step; frozen ones (a
reference, a teacher) keep the weights they started with. Only engines whose group has
`offload` on release their memory while the trainer steps.

With `fault_tolerance`, an engine that stops answering is replaced: the dead actor is ended,
a new one starts on the same bundle, takes the weights the others serve (the last refit),
and the caller retries what it had sent. `restarts` and `retried_requests` count it all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slime.backends.engine.sglang_config import EngineSpec, SglangConfig
from slime.ray.placement import Placement, actor_options, compute_device

# Server arguments our engine takes from a group's `overrides`.
SLIME_ENGINE_OVERRIDES = {"max_batch_size": int, "batch_delay_s": float}


class EngineConfigError(ValueError):
    """An engine layout that cannot be started as configured; one line saying what to change."""


def engine_actor_class(backend: str) -> type:
    """The actor class of `--rollout-backend`: our engine, or a real SGLang server."""
    if backend == "sglang":
        from slime.backends.engine.sglang_backend import SGLangActor

        return SGLangActor
    if backend == "slime":
        from slime.backends.engine.actor import EngineActor

        return EngineActor
    raise ValueError(f"--rollout-backend {backend!r}: choose slime or sglang")


def default_specs(num_engines: int, *, offload: bool) -> tuple[EngineSpec, ...]:
    """Without `--sglang-config`: one updatable one-GPU engine per rollout bundle."""
    return tuple(EngineSpec(name=f"actor-g0-e{i}", model="actor", model_path=None, worker_type="regular",
                            gpus=(i,), update_weights=True, offload=offload, overrides=())
                 for i in range(num_engines))


def actor_kwargs(spec: EngineSpec, backend: str) -> dict[str, Any]:
    """Constructor arguments of the engine actor that a group's `overrides` set."""
    if backend == "sglang":
        # SGLang server arguments, spelled as on its command line.
        extra: list[str] = []
        for key, value in spec.overrides:
            flag = "--" + key.replace("_", "-")
            if value is True:
                extra.append(flag)
            elif value is not False:
                extra += [flag, str(value)]
        return {"extra_args": tuple(extra)} if extra else {}
    out: dict[str, Any] = {}
    for key, value in spec.overrides:
        kind = SLIME_ENGINE_OVERRIDES.get(key)
        if kind is None:
            raise EngineConfigError(
                f"engine {spec.name}: overrides.{key} is not an argument of the slime engine; "
                f"it takes {', '.join(sorted(SLIME_ENGINE_OVERRIDES))} (or use --rollout-backend sglang)")
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise EngineConfigError(f"engine {spec.name}: overrides.{key} must be a number >= 0, "
                                    f"got {value!r}")
        out[key] = kind(value)
    return out


@dataclass
class _Slot:
    """One engine: what it is, where it runs, the actor and client serving it now."""

    spec: EngineSpec
    bundles: tuple[int, ...]
    model_path: str
    seed: int
    actor: Any = None
    client: Any = None
    restarts: int = 0

    def labels(self) -> dict[str, Any]:
        return {"name": self.spec.name, "model": self.spec.model, "worker_type": self.spec.worker_type,
                "rollout_gpus": list(self.spec.gpus), "bundles": list(self.bundles),
                "update_weights": self.spec.update_weights, "offload": self.spec.offload,
                "restarts": self.restarts}


class EngineGroup:
    """Start the configured engines; `clients` are the updatable ones, which the rollout uses."""

    def __init__(self, pg: Any, layout: Placement, model_path: str, *, seed: int,
                 env: Mapping[str, str] | None = None, backend: str = "slime",
                 config: SglangConfig | None = None, fault_tolerance: bool = False,
                 on_restart: Callable[[EngineGroup], None] | None = None,
                 start_timeout: float = 600.0, weights_dirs: Sequence[str] = ()) -> None:
        self._pg = pg
        self._weights_dirs = tuple(weights_dirs)  # where refits from disk may load (slime engines)
        self._layout = layout
        self._device = compute_device(env)
        self._backend = backend
        self._engine_cls = engine_actor_class(backend)
        self.fault_tolerance = fault_tolerance
        self.on_restart = on_restart
        self.restarts = 0
        self.retried_requests = 0
        self._lock = threading.Lock()
        # What every updatable engine serves now: ("disk", path, version) or ("tensor", state, version).
        self._last_refit: tuple[str, Any, int] | None = None
        specs = config.engines() if config is not None else default_specs(
            len(layout.engine_bundles), offload=layout.colocate)
        rollout_gpus = len(layout.engine_bundles)
        self.slots: list[_Slot] = []
        for i, spec in enumerate(specs):
            if max(spec.gpus) >= rollout_gpus:
                raise EngineConfigError(f"engine {spec.name} needs rollout GPU {max(spec.gpus)} but the "
                                        f"rollout has {rollout_gpus}; match --rollout-num-gpus to the config")
            actor_kwargs(spec, backend)  # a bad override fails before any actor starts
            self.slots.append(_Slot(spec=spec, bundles=tuple(layout.engine_bundles[g] for g in spec.gpus),
                                    model_path=spec.model_path or model_path, seed=seed + i))
        if not any(s.spec.update_weights for s in self.slots):
            raise EngineConfigError("no updatable engine to generate rollouts with")
        import ray

        for slot in self.slots:
            slot.actor = self._new_actor(slot)
        starts = [s.actor.start.remote() for s in self.slots]
        ready, _ = ray.wait(starts, num_returns=len(starts), timeout=start_timeout)
        if len(ready) < len(starts):
            late = [s.spec.name for s, ref in zip(self.slots, starts, strict=True) if ref not in ready]
            for s in self.slots:
                ray.kill(s.actor)
            raise EngineConfigError(
                f"engines {', '.join(late)} did not start within {start_timeout:.0f} s: not placed "
                "(two engines on one bundle?) or still loading; check the layout, or raise "
                "--engine-start-timeout")
        self._connect(ray.get(starts))

    # ---- starting -------------------------------------------------------------------------
    def _new_actor(self, slot: _Slot) -> Any:
        import ray

        cls = self._engine_cls
        actor_cls = ray.remote(cls) if not hasattr(cls, "remote") else cls
        kwargs = actor_kwargs(slot.spec, self._backend)
        if self._backend == "slime":
            kwargs["labels"] = slot.labels()
            kwargs["weights_dirs"] = self._weights_dirs
        # max_restarts=0: Ray must not bring an engine back behind our back; a restart here
        # also restores the weights and is counted.
        return actor_cls.options(max_restarts=0,
                                 **actor_options(self._pg, slot.bundles[0], self._layout.engine_gpus)).remote(
            slot.model_path, device=self._device, seed=slot.seed, **kwargs)

    def _connect(self, urls: Sequence[str]) -> None:
        from slime.backends.engine.client import EngineClient

        for slot, url in zip(self.slots, urls, strict=True):
            slot.client = EngineClient(url)
        for slot in self.slots:
            slot.client.wait_healthy(timeout=300)

    # ---- views ----------------------------------------------------------------------------
    @property
    def updatable(self) -> list[_Slot]:
        return [s for s in self.slots if s.spec.update_weights]

    @property
    def frozen(self) -> list[_Slot]:
        return [s for s in self.slots if not s.spec.update_weights]

    @property
    def clients(self) -> list[Any]:
        """Clients of the updatable engines: the ones rollouts are generated with."""
        return [s.client for s in self.updatable]

    def clients_of(self, model: str) -> list[Any]:
        """Clients of one model's engines (`--sglang-config` name)."""
        return [s.client for s in self.slots if s.spec.model == model]

    def models(self) -> list[str]:
        return list(dict.fromkeys(s.spec.model for s in self.slots))

    def versions(self) -> dict[str, str]:
        """URL → weight version each updatable engine reports."""
        return {s.client.url: s.client.weight_version() for s in self.updatable}

    def info(self) -> list[dict[str, Any]]:
        """Per engine: its labels (name, model, bundles, …), what its actor says (node, GPUs Ray
        gave it) and `/get_server_info` (device, pid, bytes held, weights digest, …)."""
        import ray

        actor_info = ray.get([s.actor.info.remote() for s in self.slots])
        return [{**a, **s.client.server_info(), **s.labels()}
                for s, a in zip(self.slots, actor_info, strict=True)]

    # ---- operations -----------------------------------------------------------------------
    def _each(self, slots: Sequence[_Slot], op: Callable[[Any], Any]) -> None:
        """Apply `op` to each slot's client; a dead engine is replaced first when tolerated."""
        from slime.backends.engine.client import EngineUnavailable

        for slot in slots:
            try:
                op(slot.client)
            except EngineUnavailable:
                if not self.fault_tolerance:
                    raise
                self.restart(slot)
                op(slot.client)

    def release(self) -> None:
        """Offloading engines free their weights and cache (colocated: the trainer steps meanwhile)."""
        self._each([s for s in self.slots if s.spec.offload], lambda c: c.release_memory_occupation())

    def resume(self) -> None:
        """Bring the offloaded engines' memory back."""
        self._each([s for s in self.slots if s.spec.offload], lambda c: c.resume_memory_occupation())

    def refit_from_disk(self, path: str, version: int) -> None:
        """Every updatable engine loads the HF directory `path` as weight version `version`."""
        self._last_refit = ("disk", path, version)
        self._each(self.updatable, lambda c: c.update_weights_from_disk(path, weight_version=str(version)))

    def refit_from_tensors(self, state: Mapping[str, Any], version: int) -> None:
        """Every updatable engine takes the named tensors as weight version `version`."""
        self._last_refit = ("tensor", state, version)
        self._each(self.updatable, lambda c: c.update_weights_from_tensor(state, weight_version=str(version)))

    def ensure_healthy(self) -> int:
        """Replace every engine that does not answer /health (fault tolerance); how many were."""
        dead = [s for s in self.slots if not s.client.is_healthy()]
        if dead and not self.fault_tolerance:
            from slime.backends.engine.client import EngineUnavailable

            raise EngineUnavailable(f"engine {dead[0].spec.name} at {dead[0].client.url} is down; "
                                    "pass --use-fault-tolerance to restart engines that die")
        for slot in dead:
            self.restart(slot)
        return len(dead)

    def recover(self, client: Any, *, requests: int = 0) -> Any:
        """The replacement for the engine behind `client` (after it failed); counts `requests` retried."""
        from slime.backends.engine.client import EngineUnavailable

        slot = next((s for s in self.slots if s.client is client), None)
        if slot is None:
            raise ValueError(f"{client!r} is not an engine of this group")
        if not self.fault_tolerance:
            raise EngineUnavailable(f"engine {slot.spec.name} at {client.url} failed; "
                                    "pass --use-fault-tolerance to restart engines that die")
        with self._lock:
            if slot.client is client:  # not already replaced by another caller
                self.restart(slot)
            self.retried_requests += requests
        return slot.client

    def restart(self, slot: _Slot) -> None:
        """End the slot's actor, start a new one on the same bundle, give it the served weights."""
        import ray

        print(f"engine {slot.spec.name} at {slot.client.url} is down; restarting it on bundle "
              f"{slot.bundles[0]}", flush=True)
        ray.kill(slot.actor, no_restart=True)
        slot.restarts += 1
        self.restarts += 1
        if self._backend == "slime":
            slot.seed += 1000  # a new engine, a new default seed; rollouts pass their own seeds
        slot.actor = self._new_actor(slot)
        from slime.backends.engine.client import EngineClient

        slot.client = EngineClient(ray.get(slot.actor.start.remote(), timeout=300))
        slot.client.wait_healthy(timeout=300)
        if slot.spec.update_weights and self._last_refit is not None:
            kind, payload, version = self._last_refit
            if kind == "disk":
                slot.client.update_weights_from_disk(payload, weight_version=str(version))
            else:
                slot.client.update_weights_from_tensor(payload, weight_version=str(version))
        print(f"engine {slot.spec.name} restarted at {slot.client.url}", flush=True)
        if self.on_restart is not None:
            self.on_restart(self)

    def shutdown(self) -> None:
        """Stop the servers and end the actors."""
        import ray

        try:
            ray.get([s.actor.stop.remote() for s in self.slots], timeout=60)
        finally:
            for s in self.slots:
                ray.kill(s.actor)
