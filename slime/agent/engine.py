"""The agent tier's client of the rollout engine's `/generate` (async, over the caller's aiohttp session).

The wire format is `slime.backends.engine.wire`'s (SGLang's): this module only sends a
`wire.request_body` and reads the answer, whole or as a stream (each `data:` event a
cumulative answer, then `data: [DONE]`), with `wire.parse_output`. Anything else is an
`EngineError`: the adapter must never record a turn from a reply it could not fully read,
nor from a generation the engine aborted.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp

from slime.backends.engine.wire import (
    EngineError,
    EngineReplyError,
    EngineRequestError,
    EngineUnavailable,
    GenerateInput,
    GenerateOutput,
    SamplingParams,
    error_message,
    parse_output,
    request_body,
)

__all__ = ["EngineClient", "EngineError", "GenerateOutput", "SamplingParams", "parse_generation"]


def parse_generation(payload: Any, *, final: bool) -> GenerateOutput:
    """One engine reply, validated; an aborted generation is an error (its turn is not recorded)."""
    out = parse_output(payload, final=final)
    reason = out.meta_info.finish_reason
    if reason is not None and reason.type == "abort":
        raise EngineReplyError(f"engine aborted the request: {reason.message or ''}")
    return out


class EngineClient:
    """Calls /generate over an aiohttp session owned by the caller."""

    def __init__(self, url: str, session: aiohttp.ClientSession, *, timeout_s: float) -> None:
        self.url = url.rstrip("/") + "/generate"
        self._http = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    def _body(self, input_ids: Sequence[int], params: SamplingParams, stream: bool) -> dict[str, Any]:
        # The tokens recorded for training must be the tokens generated: special tokens are
        # skipped in `text` only, and a stop string is trimmed from it (SGLang's defaults).
        return request_body([GenerateInput(input_ids=tuple(input_ids), params=params)], stream=stream)

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> GenerateOutput:
        """One completion, read whole."""
        try:
            async with self._http.post(
                self.url, json=self._body(input_ids, params, False), timeout=self._timeout
            ) as resp:
                raw = await resp.read()
                self._check_status(resp.status, raw)
        except aiohttp.ClientError as exc:
            raise EngineUnavailable(f"engine at {self.url} failed: {exc or type(exc).__name__}") from exc
        except asyncio.TimeoutError as exc:
            raise EngineUnavailable(f"engine at {self.url} timed out") from exc
        try:
            payload = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EngineReplyError(f"engine returned malformed JSON: {raw[:80]!r}") from None
        return parse_generation(payload, final=True)

    async def stream(self, input_ids: Sequence[int], params: SamplingParams) -> AsyncIterator[GenerateOutput]:
        """Growing snapshots of one completion; the last has a finish_reason."""
        last: GenerateOutput | None = None
        try:
            async with self._http.post(
                self.url, json=self._body(input_ids, params, True), timeout=self._timeout
            ) as resp:
                if resp.status != 200:
                    self._check_status(resp.status, await resp.read())
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
                        raise EngineReplyError(f"engine stream sent malformed JSON: {data[:80]!r}") from None
                    last = parse_generation(payload, final=False)
                    yield last
        except aiohttp.ClientError as exc:
            broke = exc or type(exc).__name__
            raise EngineUnavailable(f"engine stream from {self.url} broke: {broke}") from exc
        except asyncio.TimeoutError as exc:
            raise EngineUnavailable(f"engine stream from {self.url} timed out") from exc
        if not done:
            raise EngineReplyError("engine stream ended before [DONE] (truncated)")
        if last is None or last.meta_info.finish_reason is None:
            raise EngineReplyError("engine stream ended without a finish_reason")

    def _check_status(self, status: int, raw: bytes) -> None:
        if status != 200:
            raise EngineRequestError(self.url, status, error_message(raw, limit=200))
