"""Bad input from either side gets a clear error response and leaves the trajectory intact.

Engine side: malformed JSON, a truncated stream, an error status, a reply
whose log-probs do not match its tokens, an aborted request (the Anthropic
stream's error event is in test_anthropic_adapter.py, which loads that SDK anyway). Agent side: an
unknown session, a body that is not JSON or not the provider's shape.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from _engine import calculator_policy
from _servers import Stack, running_stack

if TYPE_CHECKING:
    import openai

NUM_GPUS = 0
USER = [{"role": "user", "content": "Please compute 2*21"}]
TOOLS: Any = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack(calculator_policy) as s:
        yield s



def first_turn(stack: Stack, api: openai.OpenAI) -> list[dict[str, Any]]:
    """One good turn, then the history an agent would send next."""
    reply = api.chat.completions.create(model="p", messages=USER, tools=TOOLS)  # type: ignore[arg-type]
    (call,) = reply.choices[0].message.tool_calls or []
    return [
        *USER,
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]


@pytest.mark.parametrize(
    ("fault", "stream", "message"),
    [
        ("status_500", False, "engine answered HTTP 500"),
        ("status_500", True, "engine answered HTTP 500"),
        ("malformed_json", False, "engine returned malformed JSON"),
        ("bad_logprobs", False, "do not match 'output_ids'"),
        ("bad_logprobs", True, "do not match 'output_ids'"),
        ("abort", False, "engine aborted the request"),
        ("truncated_stream", True, "engine stream ended before [DONE]"),
    ],
)
def test_engine_failure_is_a_clear_error_and_records_nothing(
    stack: Stack, fault: str, stream: bool, message: str
) -> None:
    import openai

    sid = stack.manager.open_session()
    with stack.openai_client(sid) as api:
        history = first_turn(stack, api)
        (good,) = stack.manager.turns(sid)
        stack.engine.faults.append(fault)

        def send() -> object:
            if stream:
                return list(
                    api.chat.completions.create(model="p", messages=history, tools=TOOLS, stream=True)
                )  # type: ignore[arg-type]
            return api.chat.completions.create(model="p", messages=history, tools=TOOLS)  # type: ignore[arg-type]

        with pytest.raises(openai.APIError) as err:
            send()
        assert message in str(err.value)
        if not stream:
            assert isinstance(err.value, openai.APIStatusError) and err.value.status_code == 502
        # The failed request left no trace; the agent's retry attaches to the good turn.
        assert stack.manager.turns(sid) == [good]
        retry = api.chat.completions.create(model="p", messages=history, tools=TOOLS)  # type: ignore[arg-type]
    assert retry.choices[0].message.content == "The answer is 42."
    turns = stack.manager.turns(sid)
    assert [t.parent for t in turns] == [None, good.id]
    (sample,) = stack.manager.samples(sid)
    assert sample.turns == (good.id, turns[1].id)


def test_unknown_or_missing_session_is_401(stack: Stack) -> None:
    import openai

    with stack.openai_client("sess-does-not-exist") as api, pytest.raises(openai.AuthenticationError) as err:
        api.chat.completions.create(model="p", messages=USER)  # type: ignore[arg-type]
    assert "unknown session 'sess-does-not-exist'" in str(err.value)
    assert "pass its id as the API key" in str(err.value)
    raw = httpx.post(f"{stack.adapter_url}/v1/chat/completions", json={"messages": USER}, timeout=10)
    assert raw.status_code == 401
    assert raw.json()["error"]["type"] == "authentication_error"


def post(stack: Stack, path: str, session: str, body: Any, *, raw: bytes | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {session}", "x-api-key": session}
    if raw is not None:
        return httpx.post(f"{stack.adapter_url}{path}", content=raw, headers=headers, timeout=10)
    return httpx.post(f"{stack.adapter_url}{path}", json=body, headers=headers, timeout=10)


@pytest.mark.parametrize(
    ("body", "raw", "message"),
    [
        (None, b'{"messages": [', "request body is not valid JSON"),
        (None, b"\xff\xfe", "request body is not valid JSON"),
        # Python's json reads NaN and recurses per level: both are refused before any parsing.
        (None, b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', "NaN is not JSON"),
        (None, b"[" * 100_000 + b"]" * 100_000, "nests 100000 levels"),
        ([1, 2], None, "must be a JSON object"),
        ({"model": "p"}, None, "'messages' must be a non-empty list"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, None, "needs a 'role'"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None, "only text content"),
        ({"messages": [{"role": "tool", "content": "x"}]}, None, "without 'tool_call_id'"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
                        ],
                    }
                ]
            },
            None,
            "arguments is not valid JSON",
        ),
        ({"messages": USER, "n": 2}, None, "'n' must be 1"),
        ({"messages": USER, "temperature": 9}, None, "'temperature' must be a number"),
        ({"messages": USER, "max_tokens": 0}, None, "'max_tokens' must be a positive integer"),
        ({"messages": USER, "stop": [1]}, None, "'stop' must be a string"),
        ({"messages": USER, "tools": [{"type": "function"}]}, None, "tools[0] must be"),
    ],
)
def test_malformed_openai_body_is_400(stack: Stack, body: Any, raw: bytes | None, message: str) -> None:
    sid = stack.manager.open_session()
    before = stack.engine.requests
    resp = post(stack, "/v1/chat/completions", sid, body, raw=raw)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert message in error["message"]
    assert stack.engine.requests == before  # rejected before reaching the engine
    assert stack.manager.turns(sid) == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_tokens": 8}, "'messages' must be a non-empty list"),
        ({"messages": [{"role": "system", "content": "x"}]}, "'user' or 'assistant'"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "expected a text or tool_result block",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": 3}],
                    }
                ]
            },
            "must be an object",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "stop_sequences": [5]},
            "'stop_sequences' must be a string or a list",
        ),
    ],
)
def test_malformed_anthropic_body_is_400(stack: Stack, body: Any, message: str) -> None:
    sid = stack.manager.open_session()
    resp = post(stack, "/v1/messages", sid, body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["type"] == "error"
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert message in resp.json()["error"]["message"]
    assert stack.manager.turns(sid) == []


def test_a_body_over_the_cap_is_refused_before_it_is_read(stack: Stack) -> None:
    sid = stack.manager.open_session()
    resp = post(stack, "/v1/chat/completions", sid, None, raw=b" " * (9 * 1024 * 1024))
    assert resp.status_code == 400 and "larger than" in resp.json()["error"]["message"]


def test_unknown_route_and_method_answer_json(stack: Stack) -> None:
    missing = httpx.get(f"{stack.adapter_url}/v1/completions", timeout=10)
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "Not Found"
    wrong = httpx.get(f"{stack.adapter_url}/v1/chat/completions", timeout=10)
    assert wrong.status_code == 405


def test_malformed_tool_call_from_the_policy_reaches_the_agent_as_text(stack: Stack) -> None:
    sid = stack.manager.open_session()
    broken = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"\n</tool_call>'
    previous = stack.engine.policy
    stack.engine.policy = lambda prompt: broken
    try:
        with stack.openai_client(sid) as api:
            reply = api.chat.completions.create(model="p", messages=USER, tools=TOOLS)  # type: ignore[arg-type]
    finally:
        stack.engine.policy = previous
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == broken
    assert len(stack.manager.turns(sid)) == 1  # a policy mistake is still a turn to train on


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
