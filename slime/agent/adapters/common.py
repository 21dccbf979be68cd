"""What both provider adapters share: the per-request context, one turn's life, SSE, errors.

A turn: resolve the session, plan its prompt tokens, call the engine (streamed
or not), parse the output, then record it. Recording happens only after the
whole generation was read and parsed, so a failed request leaves the
session's tree exactly as it was.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from slime.agent.engine import EngineClient
from slime.agent.messages import BadRequest, Message, ToolCall, ToolSpec
from slime.agent.parsing import ContentStreamer, ParsedOutput, parse_output
from slime.agent.trajectory import TrajectoryManager, Turn, UnknownSession
from slime.backends.engine.wire import EngineError, GenerateOutput, SamplingParams
from slime.utils.strict_json import JSONBodyError, loads_strict

MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class AdapterContext:
    """Everything a handler needs, stored once on the aiohttp application."""

    manager: TrajectoryManager
    engine: EngineClient
    model_name: str
    default_max_tokens: int


CONTEXT = web.AppKey("slime_agent_context", AdapterContext)


@dataclass(frozen=True, kw_only=True)
class TurnResult:
    """A recorded turn and the provider-neutral answer built from it."""

    turn: Turn
    generation: GenerateOutput
    parsed: ParsedOutput
    response: Message


# (name, description, parameter schema or None, where that schema sits in the body)
ToolEntry = tuple[str, str, Any, str]


def read_tool_list(raw: Any, entry: Callable[[int, Any], ToolEntry]) -> list[ToolSpec]:
    """A provider's `tools` list as neutral specs; `entry` reads one item in that provider's shape."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest("'tools' must be a list", param="tools")
    out = []
    for i, item in enumerate(raw):
        name, description, schema, where = entry(i, item)
        schema = schema or {"type": "object", "properties": {}}
        if not isinstance(schema, dict):
            raise BadRequest(f"{where} must be an object", param="tools")
        out.append(ToolSpec.make(name=name, description=description, parameters=schema))
    return out


async def read_json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object, or a BadRequest that says what is wrong with it."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise BadRequest(f"request body is larger than {MAX_BODY_BYTES} bytes")
    raw = await request.read()
    try:
        # Strict: NaN/Infinity would reach the sampler, and deep nesting exhausted the stack.
        body = loads_strict(raw)
    except JSONBodyError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an `Authorization: Bearer ...` header."""
    auth = headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def resolve_session(manager: TrajectoryManager, candidates: Sequence[str | None]) -> str:
    """The first candidate naming an open session (API key first, then the body's field)."""
    named = [c for c in candidates if c]
    for c in named:
        if manager.has_session(c):
            return c
    raise UnknownSession(named[0] if named else "")


def new_call_id(prefix: str) -> str:
    """A fresh id for a generated tool call."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def finish_response(parsed: ParsedOutput, call_prefix: str) -> Message:
    """The assistant message a parsed output becomes."""
    calls = tuple(
        ToolCall.make(id=new_call_id(call_prefix), name=c.name, arguments=c.arguments) for c in parsed.calls
    )
    return Message(role="assistant", content=parsed.content, tool_calls=calls)


async def run_turn(
    ctx: AdapterContext,
    session_id: str,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    params: SamplingParams,
    *,
    call_prefix: str,
    on_text: Callable[[str], Awaitable[None]] | None = None,
) -> TurnResult:
    """Generate, parse and record one turn; `on_text` receives content deltas as they are safe."""
    plan = ctx.manager.plan(session_id, messages, tools)
    tool_names = {t.name for t in tools}
    if on_text is None:
        generation = await ctx.engine.generate(plan.prompt_ids, params)
        streamer = None
    else:
        streamer = ContentStreamer(tools_offered=bool(tool_names), stops=params.stop)
        last: GenerateOutput | None = None
        async for snapshot in ctx.engine.stream(plan.prompt_ids, params):
            last = snapshot
            delta = streamer.feed(snapshot.text)
            if delta:
                await on_text(delta)
        assert last is not None  # the engine client raises when a stream ends early
        generation = last
    parsed = parse_output(generation.text, tool_names=tool_names)
    if streamer is not None and on_text is not None:
        rest = streamer.finish(parsed)
        if rest:
            await on_text(rest)
    response = finish_response(parsed, call_prefix)
    turn = ctx.manager.commit(plan, generation, response)
    return TurnResult(turn=turn, generation=generation, parsed=parsed, response=response)


def error_status(exc: Exception) -> int:
    """HTTP status for a failure the handlers catch."""
    if isinstance(exc, BadRequest):
        return 400
    if isinstance(exc, UnknownSession):
        return 401
    if isinstance(exc, EngineError):
        return 502
    return 500


async def open_sse(request: web.Request) -> web.StreamResponse:
    """Start a server-sent-events reply."""
    resp = web.StreamResponse(
        status=200,
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
    )
    await resp.prepare(request)
    return resp


async def send_sse(resp: web.StreamResponse, data: Any, *, event: str | None = None) -> None:
    """One SSE event; `data` is JSON-encoded unless it is already a string."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    await resp.write(f"{head}data: {text}\n\n".encode())


def usage_counts(turn: Turn) -> tuple[int, int]:
    """Prompt and completion token counts of a turn."""
    return len(turn.prompt_ids), len(turn.output_ids)
