"""What the RL loop asks of its trainer, its engines and its tokenizer, as protocols.

`slime.loop.Run` holds a `TrainGroup` (Ray actors, one per rank) and an `EngineGroup`, or
their in-process stand-ins (`slime.device_check.local`), or nothing (no trainer when only
rolling out, no engines when replaying saved rollouts). These protocols are the methods the
loop and `slime.resume` call, so both kinds of part fit and a checker can see a missing one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from slime.rollout.batch import TrainBatch


class Tokenizer(Protocol):
    """The slice of a Hugging Face tokenizer the rollout uses: encode, decode, the EOS id."""

    @property
    def eos_token_id(self) -> int | None: ...

    def __call__(self, text: str) -> Mapping[str, Any]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str | list[str]: ...


class Trainer(Protocol):
    """Every rank of the policy (and critic) behind one object: step, weights, checkpoints."""

    def train(self, batch: TrainBatch) -> dict[str, float]: ...

    def version(self) -> int: ...

    def full_state_dict(self) -> Mapping[str, Any]: ...

    def export_hf(self, out_dir: str) -> str: ...

    def save_checkpoint(self, root: str, rollout_id: int, data_cursor: int, *, save_optimizer: str,
                        async_save: bool) -> None: ...

    def wait_checkpoint(self) -> None: ...

    def load_checkpoint(self, root: str, step: int | None, load_optimizer: str | None,
                        load_rng: bool = True) -> dict[str, int] | None: ...

    def shutdown(self) -> None: ...


class Engines(Protocol):
    """The rollout engines: clients to generate with, memory release, refit, their state."""

    @property
    def clients(self) -> Sequence[Any]: ...

    @property
    def frozen(self) -> Sequence[Any]: ...  # engines whose weights never change (reference, teacher)

    @property
    def restarts(self) -> int: ...

    def clients_of(self, model: str) -> Sequence[Any]: ...

    def versions(self) -> dict[str, str]: ...

    def info(self) -> list[dict[str, Any]]: ...

    def release(self) -> None: ...

    def resume(self) -> None: ...

    def refit_from_disk(self, path: str, version: int) -> None: ...

    def refit_from_tensors(self, state: Mapping[str, Any], version: int) -> None: ...

    def shutdown(self) -> None: ...


class FaultTolerantEngines(Engines, Protocol):
    """Engines that restart a dead one and retry its requests (`--use-fault-tolerance`)."""

    @property
    def retried_requests(self) -> int: ...

    def ensure_healthy(self) -> int: ...

    def recover(self, client: Any, *, requests: int = 0) -> Any: ...
