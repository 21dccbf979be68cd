"""A loopback stand-in for the rollout engine's /generate (the real one needs a GPU and a model).

It speaks the same wire format (token ids in, token ids + log-probs out, plain
or SSE-streamed) and answers with a scripted policy: a function from the
decoded prompt to the completion text. Log-probs are a fixed function of
position and token id, so tests can check that samples carry exactly what the
engine produced. `faults` injects broken replies, one per request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from slime.agent.tokenizer import IM_END, ByteTokenizer

Policy = Callable[[str], str]
FAULTS = ("malformed_json", "status_500", "truncated_stream", "bad_logprobs", "abort")


@dataclass(frozen=True, kw_only=True)
class EngineCall:
    """One completed /generate call, as the engine produced it."""

    prompt_ids: tuple[int, ...]
    sampling_params: dict[str, Any]
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    streamed: bool


def logprob(position: int, token: int) -> float:
    """The engine's (deterministic) log-prob of `token` at absolute `position`."""
    return -round(0.01 + ((token * 31 + position * 17) % 97) / 100, 4)


class FakeEngine:
    """Scripted /generate server state: the policy, completed calls, pending faults."""

    def __init__(self, policy: Policy, *, chunk_tokens: int = 5) -> None:
        self.tokenizer = ByteTokenizer()
        self.policy = policy
        self.chunk_tokens = chunk_tokens
        self.calls: list[EngineCall] = []
        self.faults: list[str] = []
        self.requests = 0

    def _complete(
        self, prompt_ids: list[int], params: dict[str, Any]
    ) -> tuple[dict[str, Any], list[int], str]:
        tok = self.tokenizer
        completion = self.policy(tok.decode(prompt_ids, skip_special=False))
        text, finish = completion, {"type": "stop", "matched": tok.token_id(IM_END)}
        ids = [*tok.encode(completion), tok.token_id(IM_END)]
        for stop in params.get("stop") or []:
            at = completion.find(stop)
            if at >= 0:
                text, finish = completion[:at], {"type": "stop", "matched": stop}
                ids = tok.encode(completion[: at + len(stop)])
        limit = int(params["max_new_tokens"])
        if len(ids) > limit:
            ids = ids[:limit]
            text, finish = tok.decode(ids), {"type": "length", "length": limit}
        return finish, ids, text

    def _payload(self, prompt_ids: list[int], ids: list[int], text: str, finish: Any) -> dict[str, Any]:
        start = len(prompt_ids)
        pairs = [[logprob(start + i, t), t, None] for i, t in enumerate(ids)]
        return {
            "text": text,
            "output_ids": ids,
            "meta_info": {
                "finish_reason": finish,
                "output_token_logprobs": pairs,
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(ids),
            },
        }

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """POST /generate."""
        self.requests += 1
        body = await request.json()
        prompt_ids: list[int] = body["input_ids"]
        params: dict[str, Any] = body["sampling_params"]
        fault = self.faults.pop(0) if self.faults else None
        if fault == "status_500":
            return web.json_response({"error": "out of KV cache"}, status=500)
        if fault == "malformed_json":
            return web.Response(
                text='{"text": "half a reply", "output_ids": [1, 2', content_type="application/json"
            )
        finish, ids, text = self._complete(prompt_ids, params)
        payload = self._payload(prompt_ids, ids, text, finish)
        if fault == "bad_logprobs":
            payload["meta_info"]["output_token_logprobs"] = payload["meta_info"]["output_token_logprobs"][:-1]
        if fault == "abort":
            payload["meta_info"]["finish_reason"] = {
                "type": "abort",
                "message": "engine is shutting down",
            }
        if not body.get("stream"):
            if fault is None:
                self._record(prompt_ids, params, ids, text, streamed=False)
            return web.json_response(payload)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        step = self.chunk_tokens
        for k in range(step, len(ids), step):
            part = self._payload(prompt_ids, ids[:k], self.tokenizer.decode(ids[:k]), None)
            await resp.write(f"data: {json.dumps(part)}\n\n".encode())
            if fault == "truncated_stream":
                await resp.write_eof()  # the connection ends mid-generation, no [DONE]
                return resp
        await resp.write(f"data: {json.dumps(payload)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        if fault is None:
            self._record(prompt_ids, params, ids, text, streamed=True)
        return resp

    def _record(
        self,
        prompt_ids: list[int],
        params: dict[str, Any],
        ids: list[int],
        text: str,
        *,
        streamed: bool,
    ) -> None:
        start = len(prompt_ids)
        self.calls.append(
            EngineCall(
                prompt_ids=tuple(prompt_ids),
                sampling_params=params,
                output_ids=tuple(ids),
                logprobs=tuple(logprob(start + i, t) for i, t in enumerate(ids)),
                text=text,
                streamed=streamed,
            )
        )

    def app(self) -> web.Application:
        """The aiohttp application serving /generate and /health."""
        app = web.Application()
        app.router.add_post("/generate", self.handle)

        async def health(_: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        app.router.add_get("/health", health)
        return app


# --- scripted policies -------------------------------------------------------------------

_LAST_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)


def last_user_block(prompt: str) -> str:
    """The text of the prompt's last user block."""
    blocks = _LAST_USER.findall(prompt)
    return blocks[-1] if blocks else ""


def calculator_policy(prompt: str) -> str:
    """Asks the `calculator` tool for the expression in the question, then reports the result."""
    last = last_user_block(prompt)
    result = re.search(r"<tool_response>\n(.*?)\n</tool_response>", last, re.S)
    if result:
        return f"The answer is {result.group(1).strip()}."
    if '<tools>\n{"name": "calculator"' not in prompt:
        return f"You said: {last.strip()}"
    expr = re.search(r"compute ([0-9+*/() -]+)", last)
    expression = expr.group(1).strip() if expr else "0"
    return (
        "Let me use the calculator.\n<tool_call>\n"
        f'{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'
    )


def echo_policy(prompt: str) -> str:
    """Repeats the last user message."""
    return f"You said: {last_user_block(prompt).strip()}"
