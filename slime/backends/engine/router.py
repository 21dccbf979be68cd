"""`EngineRouter`: spread generation over engines, send control calls to all of them."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from slime.backends.engine.client import EngineClient


class EngineRouter:
    """Least-in-flight routing over engine URLs (ties go round robin); thread-safe."""

    def __init__(self, engines: Sequence[str | EngineClient], *, timeout: float = 300.0) -> None:
        if not engines:
            raise ValueError("EngineRouter needs at least one engine URL")
        self.clients = [e if isinstance(e, EngineClient) else EngineClient(e, timeout=timeout)
                        for e in engines]
        self._in_flight = [0] * len(self.clients)
        self.routed = [0] * len(self.clients)
        self._turn = itertools.count()
        self._lock = threading.Lock()

    @property
    def urls(self) -> list[str]:
        """The engines' URLs, in order."""
        return [c.url for c in self.clients]

    @contextmanager
    def _pick(self) -> Iterator[EngineClient]:
        with self._lock:
            start = next(self._turn) % len(self.clients)
            order = [(start + k) % len(self.clients) for k in range(len(self.clients))]
            index = min(order, key=lambda i: self._in_flight[i])
            self._in_flight[index] += 1
            self.routed[index] += 1
        try:
            yield self.clients[index]
        finally:
            with self._lock:
                self._in_flight[index] -= 1

    def generate(self, input_ids: Any, sampling_params: Any = None, *, return_logprob: bool = True,
                 **extra: Any) -> Any:
        """POST /generate on the least busy engine."""
        with self._pick() as client:
            return client.generate(input_ids, sampling_params, return_logprob=return_logprob, **extra)

    def _all(self, call: Callable[[EngineClient], Any]) -> list[Any]:
        # In parallel: a refit of N engines should take as long as one.
        results: list[Any] = [None] * len(self.clients)
        errors: list[BaseException | None] = [None] * len(self.clients)

        def run(i: int) -> None:
            try:
                results[i] = call(self.clients[i])
            except BaseException as exc:
                errors[i] = exc

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(self.clients))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for exc in errors:
            if exc is not None:
                raise exc
        return results

    def update_weights_from_disk(self, model_path: str, *, weight_version: str | None = None) -> list[Any]:
        """Refit every engine from a model directory."""
        return self._all(lambda c: c.update_weights_from_disk(model_path, weight_version=weight_version))

    def update_weights_from_tensor(self, named_tensors: Mapping[str, Any], *,
                                   weight_version: str | None = None) -> list[Any]:
        """Refit every engine from tensors."""
        return self._all(lambda c: c.update_weights_from_tensor(named_tensors, weight_version=weight_version))

    def release_memory_occupation(self, tags: Sequence[str] | None = None) -> list[Any]:
        """Release every engine's memory."""
        return self._all(lambda c: c.release_memory_occupation(tags))

    def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> list[Any]:
        """Resume every engine's memory."""
        return self._all(lambda c: c.resume_memory_occupation(tags))

    def flush_cache(self) -> list[Any]:
        """Flush every engine."""
        return self._all(lambda c: c.flush_cache())

    def health(self) -> None:
        """Raise (naming the URL) unless every engine answers /health."""
        self._all(lambda c: c.health())

    def weight_versions(self) -> dict[str, str]:
        """URL -> the weight version that engine reports."""
        return dict(zip(self.urls, self._all(lambda c: c.weight_version()), strict=True))
