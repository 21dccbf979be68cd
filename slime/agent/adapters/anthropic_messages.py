"""Anthropic Messages (`POST /v1/messages`), plain and streamed.

The session is the `x-api-key` header (or a bearer token), else
`metadata.user_id`. Tool results arrive as `tool_result` blocks inside a user
message; they become neutral `tool` messages in the order they were sent.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from aiohttp import web

from slime.agent.adapters.common import (
    CONTEXT,
    ToolEntry,
    TurnResult,
    bearer_token,
    error_status,
    open_sse,
    read_json_body,
    read_tool_list,
    resolve_session,
    run_turn,
    send_sse,
    usage_counts,
)
from slime.agent.adapters.sampling import sampling_params
from slime.agent.messages import BadRequest, Message, ToolCall, ToolSpec
from slime.agent.tokenizer import IM_END
from slime.agent.trajectory import UnknownSession
from slime.backends.engine.wire import EngineError, SamplingParams


def _blocks(content: Any, param: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise BadRequest(f"{param} must be a string or a list of content blocks", param=param)
    return content


def _result_text(content: Any, param: str) -> str:
    if content is None:
        return ""
    parts = []
    for b in _blocks(content, param):
        if b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise BadRequest(f"{param}: only text tool results are supported", param=param)
        parts.append(b["text"])
    return "".join(parts)


def _system(raw: Any) -> list[Message]:
    if raw is None or raw == "":
        return []
    text = "".join(b["text"] for b in _blocks(raw, "system") if b.get("type") == "text")
    return [Message(role="system", content=text)]


def read_messages(raw: Any, system: Any) -> list[Message]:
    """Anthropic `system` + `messages` → neutral messages."""
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list", param="messages")
    out = _system(system)
    for i, m in enumerate(raw):
        param = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise BadRequest(f"{param} needs a 'role' of 'user' or 'assistant'", param=param)
        blocks = _blocks(m.get("content"), f"{param}.content")
        if m["role"] == "assistant":
            text, calls = [], []
            for j, b in enumerate(blocks):
                if b.get("type") == "text" and isinstance(b.get("text"), str):
                    text.append(b["text"])
                elif (
                    b.get("type") == "tool_use"
                    and isinstance(b.get("id"), str)
                    and isinstance(b.get("name"), str)
                ):
                    if not isinstance(b.get("input", {}), dict):
                        raise BadRequest(f"{param}.content[{j}].input must be an object", param=param)
                    calls.append(ToolCall.make(id=b["id"], name=b["name"], arguments=b.get("input", {})))
                else:
                    raise BadRequest(f"{param}.content[{j}]: expected a text or tool_use block", param=param)
            out.append(Message(role="assistant", content="".join(text), tool_calls=tuple(calls)))
            continue
        pending: list[str] = []
        for j, b in enumerate(blocks):
            if b.get("type") == "text" and isinstance(b.get("text"), str):
                pending.append(b["text"])
            elif b.get("type") == "tool_result" and isinstance(b.get("tool_use_id"), str):
                if pending:
                    out.append(Message(role="user", content="".join(pending)))
                    pending = []
                content = _result_text(b.get("content"), f"{param}.content[{j}].content")
                out.append(Message(role="tool", content=content, tool_call_id=b["tool_use_id"]))
            else:
                raise BadRequest(f"{param}.content[{j}]: expected a text or tool_result block", param=param)
        if pending or not blocks:
            out.append(Message(role="user", content="".join(pending)))
    return out


def _tool_entry(i: int, t: Any) -> ToolEntry:
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        raise BadRequest(f"tools[{i}] needs a 'name'", param="tools")
    return t["name"], str(t.get("description") or ""), t.get("input_schema"), f"tools[{i}].input_schema"


def read_tools(raw: Any) -> list[ToolSpec]:
    """Anthropic `tools` → neutral tool specs."""
    return read_tool_list(raw, _tool_entry)


def _stop(result: TurnResult, params: SamplingParams) -> tuple[str, str | None]:
    if result.response.tool_calls:
        return "tool_use", None
    if result.generation.finish_kind == "length":
        return "max_tokens", None
    matched = result.generation.matched_stop
    if isinstance(matched, str) and matched in params.stop:
        return "stop_sequence", matched
    return "end_turn", None


def error_body(exc: Exception) -> dict[str, Any]:
    """An Anthropic-shaped error object."""
    kind = {400: "invalid_request_error", 401: "authentication_error"}.get(error_status(exc), "api_error")
    return {"type": "error", "error": {"type": kind, "message": str(exc)}}


async def messages_endpoint(request: web.Request) -> web.StreamResponse:
    """Answer one Messages request."""
    ctx = request.app[CONTEXT]
    try:
        body = await read_json_body(request)
        meta = body.get("metadata")
        user = meta.get("user_id") if isinstance(meta, dict) else None
        key = request.headers.get("x-api-key") or bearer_token(request.headers)
        session = resolve_session(ctx.manager, [key, user if isinstance(user, str) else None])
        messages = read_messages(body.get("messages"), body.get("system"))
        tools = read_tools(body.get("tools"))
        params = sampling_params(
            body,
            max_tokens_keys=("max_tokens",),
            stop_key="stop_sequences",
            default_max_tokens=ctx.default_max_tokens,
            stop_token_ids=(ctx.manager.tokenizer.token_id(IM_END),),
        )
        model = body["model"] if isinstance(body.get("model"), str) else ctx.model_name
        if body.get("stream"):
            return await _stream(
                request, session=session, messages=messages, tools=tools, params=params, model=model
            )
        result = await run_turn(ctx, session, messages, tools, params, call_prefix="toolu_")
    except (BadRequest, UnknownSession, EngineError) as exc:
        return web.json_response(error_body(exc), status=error_status(exc))
    content: list[dict[str, Any]] = []
    if result.response.content:
        content.append({"type": "text", "text": result.response.content})
    content += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments_dict()}
        for c in result.response.tool_calls
    ]
    stop_reason, stop_sequence = _stop(result, params)
    prompt, completion = usage_counts(result.turn)
    return web.json_response(
        {
            "id": f"msg_{uuid.uuid4().hex}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": {"input_tokens": prompt, "output_tokens": completion},
        }
    )


async def _stream(
    request: web.Request,
    *,
    session: str,
    messages: list[Message],
    tools: list[ToolSpec],
    params: SamplingParams,
    model: str,
) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    resp = await open_sse(request)
    await send_sse(
        resp,
        {
            "type": "message_start",
            "message": {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            },
        },
        event="message_start",
    )
    index = 0
    text_open = False

    async def on_text(text: str) -> None:
        nonlocal text_open
        if not text_open:
            text_open = True
            await send_sse(
                resp,
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                },
                event="content_block_start",
            )
        await send_sse(
            resp,
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": text},
            },
            event="content_block_delta",
        )

    try:
        result = await run_turn(ctx, session, messages, tools, params, call_prefix="toolu_", on_text=on_text)
    except (BadRequest, UnknownSession, EngineError) as exc:
        await send_sse(resp, error_body(exc), event="error")
        await resp.write_eof()
        return resp
    if text_open:
        await send_sse(resp, {"type": "content_block_stop", "index": index}, event="content_block_stop")
        index += 1
    for call in result.response.tool_calls:
        await send_sse(
            resp,
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": {},
                },
            },
            event="content_block_start",
        )
        await send_sse(
            resp,
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {
                    "type": "input_json_delta",
                    "partial_json": json.dumps(call.arguments_dict()),
                },
            },
            event="content_block_delta",
        )
        await send_sse(resp, {"type": "content_block_stop", "index": index}, event="content_block_stop")
        index += 1
    stop_reason, stop_sequence = _stop(result, params)
    prompt, completion = usage_counts(result.turn)
    await send_sse(
        resp,
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"input_tokens": prompt, "output_tokens": completion},
        },
        event="message_delta",
    )
    await send_sse(resp, {"type": "message_stop"}, event="message_stop")
    await resp.write_eof()
    return resp
