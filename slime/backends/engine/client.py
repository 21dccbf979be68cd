"""`EngineClient`: the trainer's side of SGLang's native HTTP API, for our engine or a real SGLang server."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from slime.backends.engine.weights import TENSOR_FORMAT, serialize_named_tensors
from slime.backends.engine.wire import (
    EngineError,
    EngineRequestError,
    EngineUnavailable,
    SamplingParams,
    error_message,
)

__all__ = ["EngineClient", "EngineError", "EngineRequestError", "EngineUnavailable"]

# Loopback and cluster-internal addresses: a proxy from the environment must never answer for them.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


Params = Mapping[str, Any] | SamplingParams


def _params_json(params: Params) -> dict[str, Any]:
    return params.to_json() if isinstance(params, SamplingParams) else dict(params)


class EngineClient:
    """Calls one engine's endpoints; every method raises an `EngineError` naming the URL on failure."""

    def __init__(self, url: str, *, timeout: float = 300.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"EngineClient({self.url!r})"

    def request(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        """One call; returns the decoded JSON answer (None for an empty one)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with _OPENER.open(req, timeout=timeout or self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise EngineRequestError(self.url, exc.code, error_message(exc.read())) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EngineUnavailable(f"engine at {self.url} is unreachable ({method} {path}: {reason}); "
                                    f"is it running?") from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    # ---- generation -----------------------------------------------------------------------
    def generate(self, input_ids: Sequence[int] | Sequence[Sequence[int]],
                 sampling_params: Params | Sequence[Params] | None = None, *,
                 return_logprob: bool = True, **extra: Any) -> Any:
        """POST /generate; one prompt gives one answer dict, a list of prompts a list of them.

        `sampling_params`: `wire.SamplingParams` (or its JSON, as SGLang's clients send it);
        read the answers with `wire.parse_outputs`.
        """
        body: dict[str, Any] = {"input_ids": [list(p) for p in input_ids]
                                if input_ids and not isinstance(input_ids[0], int) else list(input_ids),
                                "return_logprob": return_logprob, **extra}
        if sampling_params is not None:
            body["sampling_params"] = (_params_json(sampling_params)
                                       if isinstance(sampling_params, (Mapping, SamplingParams))
                                       else [_params_json(p) for p in sampling_params])
        return self.request("POST", "/generate", body)

    # ---- weights --------------------------------------------------------------------------
    def update_weights_from_disk(self, model_path: str, *, weight_version: str | None = None) -> Any:
        """POST /update_weights_from_disk."""
        body: dict[str, Any] = {"model_path": str(model_path)}
        if weight_version is not None:
            body["weight_version"] = str(weight_version)
        return self.request("POST", "/update_weights_from_disk", body)

    def update_weights_from_tensor(self, named_tensors: Mapping[str, Any], *,
                                   weight_version: str | None = None) -> Any:
        """POST /update_weights_from_tensor with the tensors as one base64 safetensors payload."""
        body: dict[str, Any] = {"serialized_named_tensors": [serialize_named_tensors(named_tensors)],
                                "load_format": TENSOR_FORMAT}
        if weight_version is not None:
            body["weight_version"] = str(weight_version)
        return self.request("POST", "/update_weights_from_tensor", body)

    def weight_version(self) -> str:
        """GET /get_weight_version."""
        return str(self.request("GET", "/get_weight_version")["weight_version"])

    # ---- memory ---------------------------------------------------------------------------
    def release_memory_occupation(self, tags: Sequence[str] | None = None) -> Any:
        """POST /release_memory_occupation (all tags when None)."""
        body = {} if tags is None else {"tags": list(tags)}
        return self.request("POST", "/release_memory_occupation", body)

    def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> Any:
        """POST /resume_memory_occupation (all tags when None)."""
        body = {} if tags is None else {"tags": list(tags)}
        return self.request("POST", "/resume_memory_occupation", body)

    # ---- state ----------------------------------------------------------------------------
    def health(self) -> None:
        """GET /health; raises when the engine is down or unhealthy."""
        self.request("GET", "/health", timeout=10)

    def is_healthy(self) -> bool:
        """Whether GET /health answers 200."""
        try:
            self.health()
        except EngineError:
            return False
        return True

    def wait_healthy(self, timeout: float = 300.0, interval: float = 0.5) -> None:
        """Poll /health until it answers; `EngineUnavailable` naming the URL after `timeout`."""
        deadline = time.monotonic() + timeout
        while not self.is_healthy():
            if time.monotonic() > deadline:
                raise EngineUnavailable(f"engine at {self.url} did not become healthy within {timeout:.0f} s")
            time.sleep(interval)

    def flush_cache(self) -> Any:
        """POST /flush_cache."""
        return self.request("POST", "/flush_cache", {})

    def model_info(self) -> dict[str, Any]:
        """GET /get_model_info."""
        return dict(self.request("GET", "/get_model_info"))

    def server_info(self) -> dict[str, Any]:
        """GET /get_server_info (for our engine: device, gpu_ids, pid, model_bytes, …)."""
        return dict(self.request("GET", "/get_server_info"))

    info = server_info
