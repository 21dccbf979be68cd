"""OpenAI Chat Completions (`POST /v1/chat/completions`), plain and streamed.

The session is the bearer token (the agent's API key), else the body's `user`.
`tool_choice` is accepted and not enforced: the policy decides whether to call.
"""

from __future__ import annotations

import time
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
from slime.agent.messages import BadRequest, Message, ToolCall, ToolSpec, parse_arguments
from slime.agent.tokenizer import IM_END
from slime.agent.trajectory import UnknownSession
from slime.backends.engine.wire import EngineError

_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


def _text(content: Any, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise BadRequest(f"{param}[{i}]: only text content parts are supported", param=param)
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"{param} must be a string or a list of text parts", param=param)


def _tool_calls(raw: Any, param: str) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise BadRequest(f"{param} must be a list", param=param)
    calls = []
    for i, c in enumerate(raw):
        fn = c.get("function") if isinstance(c, dict) else None
        if (
            not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or not isinstance(c.get("id"), str)
        ):
            raise BadRequest(f"{param}[{i}] needs an 'id' and a 'function' with a 'name'", param=param)
        args = parse_arguments(fn.get("arguments", "{}"), param=f"{param}[{i}].function.arguments")
        calls.append(ToolCall.make(id=c["id"], name=fn["name"], arguments=args))
    return tuple(calls)


def read_messages(raw: Any) -> list[Message]:
    """OpenAI `messages` → neutral messages."""
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(raw):
        param = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise BadRequest(f"{param} needs a 'role' among {sorted(_ROLES)}", param=param)
        role = _ROLES[m["role"]]
        content = _text(m.get("content"), f"{param}.content")
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise BadRequest(f"{param} is a tool result without 'tool_call_id'", param=param)
            out.append(Message(role="tool", content=content, tool_call_id=m["tool_call_id"]))
        elif role == "assistant":
            calls = _tool_calls(m.get("tool_calls"), f"{param}.tool_calls")
            out.append(Message(role="assistant", content=content, tool_calls=calls))
        else:
            out.append(Message(role=role, content=content))  # type: ignore[arg-type]
    return out


def _tool_entry(i: int, t: Any) -> ToolEntry:
    fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise BadRequest(
            f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
            param="tools",
        )
    where = f"tools[{i}].function.parameters"
    return fn["name"], str(fn.get("description") or ""), fn.get("parameters"), where


def read_tools(raw: Any) -> list[ToolSpec]:
    """OpenAI `tools` → neutral tool specs."""
    return read_tool_list(raw, _tool_entry)


def _finish_reason(result: TurnResult) -> str:
    if result.response.tool_calls:
        return "tool_calls"
    return "length" if result.generation.finish_kind == "length" else "stop"


def _wire_calls(result: TurnResult) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in result.response.tool_calls
    ]


def _usage(result: TurnResult) -> dict[str, int]:
    prompt, completion = usage_counts(result.turn)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def error_body(exc: Exception) -> dict[str, Any]:
    """An OpenAI-shaped error object."""
    kind = {400: "invalid_request_error", 401: "authentication_error"}.get(error_status(exc), "api_error")
    return {
        "error": {
            "message": str(exc),
            "type": kind,
            "param": getattr(exc, "param", None),
            "code": None,
        }
    }


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Answer one Chat Completions request."""
    ctx = request.app[CONTEXT]
    try:
        body = await read_json_body(request)
        user = body.get("user")
        session = resolve_session(
            ctx.manager, [bearer_token(request.headers), user if isinstance(user, str) else None]
        )
        messages = read_messages(body.get("messages"))
        tools = read_tools(body.get("tools"))
        if body.get("n", 1) != 1:
            raise BadRequest("'n' must be 1: each choice would be its own trajectory branch", param="n")
        params = sampling_params(
            body,
            max_tokens_keys=("max_completion_tokens", "max_tokens"),
            stop_key="stop",
            default_max_tokens=ctx.default_max_tokens,
            stop_token_ids=(ctx.manager.tokenizer.token_id(IM_END),),
        )
        model = body["model"] if isinstance(body.get("model"), str) else ctx.model_name
        if body.get("stream"):
            opts = body.get("stream_options")
            include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
            return await _stream(
                request,
                session=session,
                messages=messages,
                tools=tools,
                params=params,
                model=model,
                include_usage=include_usage,
            )
        result = await run_turn(ctx, session, messages, tools, params, call_prefix="call_")
    except (BadRequest, UnknownSession, EngineError) as exc:
        return web.json_response(error_body(exc), status=error_status(exc))
    message: dict[str, Any] = {"role": "assistant", "content": result.response.content or None}
    if result.response.tool_calls:
        message["tool_calls"] = _wire_calls(result)
    return web.json_response(
        {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": _finish_reason(result),
                    "logprobs": None,
                }
            ],
            "usage": _usage(result),
        }
    )


async def _stream(
    request: web.Request,
    *,
    session: str,
    messages: list[Message],
    tools: list[ToolSpec],
    params: Any,
    model: str,
    include_usage: bool,
) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    resp = await open_sse(request)
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            **base,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    async def on_text(text: str) -> None:
        await send_sse(resp, chunk({"content": text}))

    await send_sse(resp, chunk({"role": "assistant", "content": ""}))
    try:
        result = await run_turn(ctx, session, messages, tools, params, call_prefix="call_", on_text=on_text)
    except (BadRequest, UnknownSession, EngineError) as exc:
        # Headers are gone already: the error travels as an event, and no [DONE] follows.
        await send_sse(resp, error_body(exc))
        await resp.write_eof()
        return resp
    for i, call in enumerate(_wire_calls(result)):
        await send_sse(resp, chunk({"tool_calls": [{"index": i, **call}]}))
    await send_sse(resp, chunk({}, _finish_reason(result)))
    if include_usage:
        await send_sse(resp, {**base, "choices": [], "usage": _usage(result)})
    await send_sse(resp, "[DONE]")
    await resp.write_eof()
    return resp
