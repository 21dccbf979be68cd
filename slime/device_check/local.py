"""In-process stand-ins for `EngineGroup` and `TrainGroup`, so the loop's functions run without Ray.

`slime.loop` talks to `run.engines` and `run.trainer` through a handful of methods; these
classes give them the same methods over an `Engine` and a `TrainRank` living in this process.
Requests still go through the wire format of `/generate` (`api.parse_generate` and
`build_responses`), so what the loop reads is what the HTTP server would have answered.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from slime.backends.engine.api import build_responses, parse_generate
from slime.backends.engine.engine import Engine


class LocalClient:
    """`EngineClient.generate` answered by an `Engine` of this process instead of over HTTP."""

    def __init__(self, engine: Engine, name: str) -> None:
        self.engine = engine
        self.url = f"local://{name}"
        self.tokens_generated = 0
        self.generate_seconds = 0.0

    def generate(self, input_ids: Sequence[int] | Sequence[Sequence[int]],
                 sampling_params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None, *,
                 return_logprob: bool = True) -> Any:
        """What POST /generate answers: one dict for one prompt, a list for a list."""
        engine = self.engine
        body: dict[str, Any] = {"input_ids": [list(p) for p in input_ids]  # type: ignore[arg-type]
                                if input_ids and not isinstance(input_ids[0], int) else list(input_ids),
                                "return_logprob": return_logprob}
        if sampling_params is not None:
            body["sampling_params"] = (dict(sampling_params) if isinstance(sampling_params, Mapping)
                                       else [dict(p) for p in sampling_params])
        prompts, batched = parse_generate(body, engine.encode)
        started = time.perf_counter()
        gens, version = engine.generate(engine.sequences(prompts))
        _sync(engine.device)
        latency = time.perf_counter() - started
        self.generate_seconds += latency
        self.tokens_generated += sum(len(g.output_ids) for g in gens)
        out = [a.to_json() for a in build_responses(prompts, gens, weight_version=version, latency_s=latency,
                                                    decode=engine.decode)]
        return out if batched or len(out) > 1 else out[0]


def _sync(device: torch.device) -> None:
    # CUDA kernels run asynchronously: a clock read before they finish times the launch only.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class LocalEngines:
    """One updatable, offloading engine behind the methods the loop calls on `EngineGroup`."""

    def __init__(self, engine: Engine, name: str = "actor-0") -> None:
        self.engine = engine
        self.name = name
        self.client = LocalClient(engine, name)
        self.restarts = 0
        self.frozen: list[Any] = []  # no reference or teacher engines here

    @property
    def clients(self) -> list[LocalClient]:
        return [self.client]

    def clients_of(self, model: str) -> list[LocalClient]:
        return [self.client]

    def versions(self) -> dict[str, str]:
        return {self.client.url: str(self.engine.weight_version)}

    def info(self) -> list[dict[str, Any]]:
        return [{**self.engine.info(), "name": self.name, "model": "actor", "update_weights": True,
                 "offload": True, "restarts": 0, "url": self.client.url}]

    def release(self) -> None:
        self.engine.release_memory()

    def resume(self) -> None:
        self.engine.resume_memory()

    def refit_from_tensors(self, state: Mapping[str, Any], version: int) -> None:
        self.engine.update_weights_from_tensor(state, weight_version=str(version))

    def refit_from_disk(self, path: str, version: int) -> None:
        self.engine.update_weights_from_disk(path, weight_version=str(version))

    def shutdown(self) -> None:
        self.engine.close()


class LocalTrainer:
    """One `TrainRank` behind the methods the loop calls on `TrainGroup` (world size 1).

    Around each step it also takes the trainer's log-probs of the batch before and after the
    update, so the check can ask whether the step moved the policy towards the advantages.
    """

    def __init__(self, rank: Any) -> None:
        self.rank = rank
        self.surrogate_gains: list[float] = []

    def train(self, batch: Any) -> dict[str, float]:
        before = trainer_log_probs(self.rank, batch)
        metrics: dict[str, float] = self.rank.train(batch)
        after = trainer_log_probs(self.rank, batch)
        # GRPO's advantage is the sample's normalised reward on every token: a step that follows
        # the policy gradient raises Σ adv · mean Δlog-prob (to first order, for a small step).
        gain = sum(adv * sum(a - b for a, b in zip(new, old, strict=True)) / len(old)
                   for adv, new, old in zip(batch.rewards, after, before, strict=True)) / batch.size
        self.surrogate_gains.append(gain)
        return metrics

    def version(self) -> int:
        return int(self.rank.get_version())

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        state = self.rank.full_state_dict()
        assert state is not None  # rank 0 of a world of one
        return dict(state)

    def export_hf(self, out_dir: str) -> str:
        return str(self.rank.export_hf(out_dir))

    def save_checkpoint(self, root: str, rollout_id: int, data_cursor: int, *, save_optimizer: str,
                        async_save: bool) -> None:
        self.rank.save_checkpoint(root, rollout_id, data_cursor, save_optimizer=save_optimizer,
                                  async_save=async_save)

    def wait_checkpoint(self) -> None:
        self.rank.wait_checkpoint()

    def load_checkpoint(self, root: str, step: int | None, load_optimizer: str | None,
                        load_rng: bool = True) -> dict[str, int] | None:
        state: dict[str, int] | None = self.rank.load_checkpoint(root, step, load_optimizer, load_rng)
        return state


def trainer_log_probs(rank: Any, batch: Any, autocast: torch.dtype | None = None) -> list[list[float]]:
    """The trainer's log-probs of every response token of `batch` (its own micro-batches and forward).

    `autocast` runs the forward in that dtype (mixed precision: fp32 weights, bf16 matmuls).
    """
    from slime.backends.fsdp import math as M

    device = torch.device(rank.device)
    out: dict[int, list[float]] = {}
    mixed = (torch.autocast(device.type, dtype=autocast) if autocast is not None
             else contextlib.nullcontext())
    with torch.no_grad(), mixed:
        for mb in rank._my_micro_batches(batch):
            logp, _ = M.response_log_probs(rank._logits(rank.policy, mb), mb, 1.0)
            for row, i in enumerate(mb.indices):
                out[i] = logp[row, :batch.response_lengths[i]].float().cpu().tolist()
    return [out[i] for i in range(batch.size)]
