"""Client of the rollout engine's token-level `/generate` endpoint (SGLang's wire format).

Request: {"input_ids": [...], "sampling_params": {...}, "return_logprob": true,
"stream": bool}. Reply (or each streamed `data:` event, cumulative):
{"text": str, "output_ids": [int], "meta_info": {"finish_reason":
{"type": "stop"|"length"|"abort", "matched": ...} | null,
"output_token_logprobs": [[logprob, token_id, ...], ...]}}. A stream ends
with `data: [DONE]`. Anything else is an `EngineError`: the adapter must
never record a turn from a reply it could not fully read.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

FinishReason = Literal["stop", "length"]


class EngineError(RuntimeError):
    """The engine failed or answered something unreadable; the turn is not recorded."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Sampling parameters in the engine's vocabulary."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The `sampling_params` object of a /generate request."""
        out: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop": list(self.stop),
            "stop_token_ids": list(self.stop_token_ids),
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            # The tokens recorded for training must be the tokens generated.
            "skip_special_tokens": True,
            "no_stop_trim": False,
        }
        if self.seed is not None:
            out["sampling_seed"] = self.seed
        return out


@dataclass(frozen=True, kw_only=True)
class Generation:
    """What the engine produced for one prompt (a stream yields growing snapshots)."""

    text: str
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason | None  # None while a stream is still going
    matched_stop: str | int | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)


def parse_generation(payload: Any, *, final: bool) -> Generation:
    """Validate one engine reply; raise EngineError on any malformed field."""
    if not isinstance(payload, dict):
        raise EngineError("engine reply is not a JSON object")
    if "error" in payload:
        raise EngineError(f"engine reported an error: {payload['error']}")
    text, ids, meta = payload.get("text"), payload.get("output_ids"), payload.get("meta_info")
    if not isinstance(text, str):
        raise EngineError("engine reply has no string 'text'")
    if not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise EngineError("engine reply has no list of token ids 'output_ids'")
    if not isinstance(meta, dict):
        raise EngineError("engine reply has no 'meta_info' object")
    pairs = meta.get("output_token_logprobs")
    if not isinstance(pairs, list) or len(pairs) != len(ids):
        raise EngineError("engine reply's 'output_token_logprobs' do not match 'output_ids'")
    logprobs: list[float] = []
    for pair, tok in zip(pairs, ids, strict=True):
        ok = isinstance(pair, list) and len(pair) >= 2 and isinstance(pair[0], (int, float))
        if not ok or pair[1] != tok or not math.isfinite(pair[0]) or pair[0] > 0:
            raise EngineError(f"engine reply has a bad log-prob entry {pair!r} for token {tok}")
        logprobs.append(float(pair[0]))
    reason = meta.get("finish_reason")
    finish: FinishReason | None = None
    matched: str | int | None = None
    if reason is not None:
        kind = reason.get("type") if isinstance(reason, dict) else None
        if kind == "abort":
            raise EngineError(f"engine aborted the request: {reason.get('message', '')}")
        if kind not in ("stop", "length"):
            raise EngineError(f"engine reply has an unknown finish_reason {reason!r}")
        finish = kind
        matched = reason.get("matched")
    if final and finish is None:
        raise EngineError("engine reply ended without a finish_reason")
    return Generation(
        text=text,
        output_ids=tuple(ids),
        logprobs=tuple(logprobs),
        finish_reason=finish,
        matched_stop=matched,
        meta=meta,
    )


class EngineClient:
    """Calls /generate over an aiohttp session owned by the caller."""

    def __init__(self, url: str, session: aiohttp.ClientSession, *, timeout_s: float) -> None:
        self.url = url.rstrip("/") + "/generate"
        self._http = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    def _body(self, input_ids: Sequence[int], params: SamplingParams, stream: bool) -> dict[str, Any]:
        return {
            "input_ids": list(input_ids),
            "sampling_params": params.to_json(),
            "return_logprob": True,
            "stream": stream,
        }

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> Generation:
        """One completion, read whole."""
        try:
            async with self._http.post(
                self.url, json=self._body(input_ids, params, False), timeout=self._timeout
            ) as resp:
                raw = await resp.read()
                _check_status(resp.status, raw)
        except aiohttp.ClientError as exc:
            raise EngineError(f"engine at {self.url} failed: {exc or type(exc).__name__}") from exc
        except asyncio.TimeoutError as exc:
            raise EngineError(f"engine at {self.url} timed out") from exc
        try:
            payload = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EngineError(f"engine returned malformed JSON: {raw[:80]!r}") from None
        return parse_generation(payload, final=True)

    async def stream(self, input_ids: Sequence[int], params: SamplingParams) -> AsyncIterator[Generation]:
        """Growing snapshots of one completion; the last has a finish_reason."""
        last: Generation | None = None
        try:
            async with self._http.post(
                self.url, json=self._body(input_ids, params, True), timeout=self._timeout
            ) as resp:
                if resp.status != 200:
                    _check_status(resp.status, await resp.read())
                done = False
                async for line in resp.content:
                    data = line.decode("utf-8", errors="replace").strip()
                    if not data.startswith("data:"):
                        continue
                    data = data[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    try:
                        payload = json.loads(data)
                    except json.JSONDecodeError:
                        raise EngineError(f"engine stream sent malformed JSON: {data[:80]!r}") from None
                    last = parse_generation(payload, final=False)
                    yield last
        except aiohttp.ClientError as exc:
            raise EngineError(f"engine stream from {self.url} broke: {exc or type(exc).__name__}") from exc
        except asyncio.TimeoutError as exc:
            raise EngineError(f"engine stream from {self.url} timed out") from exc
        if not done:
            raise EngineError("engine stream ended before [DONE] (truncated)")
        if last is None or last.finish_reason is None:
            raise EngineError("engine stream ended without a finish_reason")


def _check_status(status: int, raw: bytes) -> None:
    if status != 200:
        detail = raw[:200].decode("utf-8", errors="replace")
        raise EngineError(f"engine answered HTTP {status}: {detail}", status=status)
