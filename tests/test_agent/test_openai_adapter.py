"""The OpenAI Chat Completions adapter, driven by the real `openai` client over loopback HTTP."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import httpx
import pytest
from _checks import assert_sample_is_chain
from _engine import calculator_policy
from _servers import Stack, running_stack

if TYPE_CHECKING:
    import openai

NUM_GPUS = 0

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack(calculator_policy) as s:
        yield s



def test_health_and_models(stack: Stack) -> None:
    health = httpx.get(f"{stack.adapter_url}/health", timeout=5)
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
    assert health.json()["engine"] == f"{stack.engine_url}/generate"
    with stack.openai_client("any") as api:
        models = api.models.list()
    assert [m.id for m in models.data] == ["slime-policy"]


def test_plain_completion_records_what_the_engine_generated(stack: Stack) -> None:
    sid = stack.manager.open_session()
    before = len(stack.engine.calls)
    with stack.openai_client(sid) as api:
        reply = api.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hello there"}], temperature=0.7
        )
    assert reply.choices[0].message.content == "You said: hello there"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "policy"
    (call,) = stack.engine.calls[before:]
    assert call.sampling_params["temperature"] == 0.7
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(call.prompt_ids)
    assert reply.usage.completion_tokens == len(call.output_ids)
    (sample,) = stack.manager.samples(sid)
    assert_sample_is_chain(sample, [call])
    assert sample.loss_mask == (1,) * len(call.output_ids)


def test_streamed_completion_matches_plain_text(stack: Stack) -> None:
    sid = stack.manager.open_session()
    before = len(stack.engine.calls)
    with stack.openai_client(sid) as api:
        stream = api.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": "stream this reply please"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "You said: stream this reply please"
    # The text arrived in several deltas, not in one piece at the end.
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 2
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    (call,) = stack.engine.calls[before:]
    assert call.streamed
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(call.output_ids)
    (sample,) = stack.manager.samples(sid)
    assert_sample_is_chain(sample, [call])


def run_calculator(arguments: str) -> str:
    expression = json.loads(arguments)["expression"]
    assert set(expression) <= set("0123456789+-*/() ")
    return str(eval(expression))  # the expression is checked to be arithmetic only


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip_is_one_leaf_chain(stack: Stack, stream: bool) -> None:
    sid = stack.manager.open_session()
    with stack.openai_client(sid) as api:
        _round_trip(stack, sid, api, stream)


def _round_trip(stack: Stack, sid: str, api: openai.OpenAI, stream: bool) -> None:
    before = len(stack.engine.calls)
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are careful with arithmetic."},
        {"role": "user", "content": "Please compute 17*23 for me."},
    ]
    if stream:
        chunks = list(api.chat.completions.create(model="p", messages=messages, tools=TOOLS, stream=True))
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        deltas = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
        assert len(deltas) == 1 and deltas[0].function is not None
        call_id, name, arguments = deltas[0].id, deltas[0].function.name, deltas[0].function.arguments
        finish = chunks[-1].choices[0].finish_reason
    else:
        reply = api.chat.completions.create(model="p", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        content = message.content or ""
        assert message.tool_calls is not None and len(message.tool_calls) == 1
        tc = message.tool_calls[0]
        assert tc.type == "function"
        call_id, name, arguments = tc.id, tc.function.name, tc.function.arguments
        finish = reply.choices[0].finish_reason
    # The tool block never reaches the agent as text.
    assert content == "Let me use the calculator."
    assert finish == "tool_calls"
    assert name == "calculator"
    assert json.loads(arguments or "") == {"expression": "17*23"}
    messages += [
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": run_calculator(arguments or "")},
    ]
    final = api.chat.completions.create(model="p", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    assert final.choices[0].message.content == "The answer is 391."
    calls = stack.engine.calls[before:]
    assert len(calls) == 2
    assert "<tool_response>\n391\n</tool_response>" in stack.engine.tokenizer.decode(
        list(calls[1].prompt_ids)
    )
    turns = stack.manager.turns(sid)
    assert [t.parent for t in turns] == [None, turns[0].id]
    (sample,) = stack.manager.samples(sid)
    assert_sample_is_chain(sample, calls)
    assert stack.manager.drifts(sid) == []


def test_body_user_field_names_the_session(stack: Stack) -> None:
    sid = stack.manager.open_session()
    with stack.openai_client("not-a-session") as api:
        reply = api.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}], user=sid)
    assert reply.choices[0].message.content == "You said: hi"
    assert len(stack.manager.turns(sid)) == 1


def test_max_tokens_truncates_and_says_length(stack: Stack) -> None:
    sid = stack.manager.open_session()
    with stack.openai_client(sid) as api:
        reply = api.chat.completions.create(
            model="p", messages=[{"role": "user", "content": "a long message"}], max_tokens=4
        )
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content == "You"
    (sample,) = stack.manager.samples(sid)
    assert sample.status == "truncated"
    assert sample.response_length == 4


def test_concurrent_retries_of_one_request_become_sibling_leaves(stack: Stack) -> None:
    sid = stack.manager.open_session()
    messages = [{"role": "user", "content": "same question"}]
    with stack.openai_client(sid) as api, ThreadPoolExecutor(4) as pool:
        replies = list(
            pool.map(lambda _: api.chat.completions.create(model="p", messages=messages), range(4))  # type: ignore[arg-type]
        )
    assert {r.choices[0].message.content for r in replies} == {"You said: same question"}
    turns = stack.manager.turns(sid)
    assert len({t.id for t in turns}) == 4
    assert all(t.parent is None for t in turns)
    samples = stack.manager.samples(sid)
    assert sorted(s.leaf for s in samples) == sorted(t.id for t in turns)
    assert len({s.tokens for s in samples}) == 1  # same prompt, same deterministic output


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
