"""The Anthropic Messages adapter, driven by the real `anthropic` client over loopback HTTP."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from _checks import assert_sample_is_chain
from _engine import calculator_policy
from _servers import Stack, running_stack

if TYPE_CHECKING:
    pass

NUM_GPUS = 0

TOOLS = [
    {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "input_schema": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    }
]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack(calculator_policy) as s:
        yield s



def test_plain_message_records_what_the_engine_generated(stack: Stack) -> None:
    sid = stack.manager.open_session()
    before = len(stack.engine.calls)
    with stack.anthropic_client(sid) as api:
        reply = api.messages.create(
            model="policy",
            max_tokens=256,
            system="Answer briefly.",
            messages=[{"role": "user", "content": "good morning"}],
            # This SDK version has no sampling keywords; the adapter still reads them.
            extra_body={"top_k": 40, "temperature": 0.5},
        )
    assert [b.type for b in reply.content] == ["text"]
    assert reply.content[0].text == "You said: good morning"  # type: ignore[union-attr]
    assert reply.stop_reason == "end_turn"
    (call,) = stack.engine.calls[before:]
    assert call.sampling_params["top_k"] == 40
    assert call.sampling_params["temperature"] == 0.5
    assert call.sampling_params["max_new_tokens"] == 256
    prompt = stack.engine.tokenizer.decode(list(call.prompt_ids), skip_special=False)
    assert prompt.startswith("<|im_start|>system\nAnswer briefly.<|im_end|>\n")
    assert reply.usage.input_tokens == len(call.prompt_ids)
    assert reply.usage.output_tokens == len(call.output_ids)
    (sample,) = stack.manager.samples(sid)
    assert_sample_is_chain(sample, [call])


def test_streamed_message_arrives_in_deltas(stack: Stack) -> None:
    sid = stack.manager.open_session()
    before = len(stack.engine.calls)
    with (
        stack.anthropic_client(sid) as api,
        api.messages.stream(
            model="policy", max_tokens=256, messages=[{"role": "user", "content": "tell me in pieces"}]
        ) as stream,
    ):
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 2
    assert "".join(pieces) == "You said: tell me in pieces"
    assert final.stop_reason == "end_turn"
    (call,) = stack.engine.calls[before:]
    assert call.streamed
    assert final.usage.output_tokens == len(call.output_ids)
    (sample,) = stack.manager.samples(sid)
    assert_sample_is_chain(sample, [call])


def test_stop_sequence_is_reported(stack: Stack) -> None:
    sid = stack.manager.open_session()
    with stack.anthropic_client(sid) as api:
        reply = api.messages.create(
            model="p",
            max_tokens=64,
            stop_sequences=["morning"],
            messages=[{"role": "user", "content": "good morning all"}],
        )
    assert reply.stop_reason == "stop_sequence"
    assert reply.stop_sequence == "morning"
    assert reply.content[0].text == "You said: good"  # type: ignore[union-attr]
    with (
        stack.anthropic_client(sid) as api,
        api.messages.stream(
            model="p",
            max_tokens=64,
            stop_sequences=["morning"],
            messages=[{"role": "user", "content": "good morning all"}],
        ) as stream,
    ):
        # Streamed text never shows part of the stop string, which the engine streams raw.
        assert "".join(stream.text_stream) == "You said: good"
        assert stream.get_final_message().stop_sequence == "morning"


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip_is_one_leaf_chain(stack: Stack, stream: bool) -> None:
    sid = stack.manager.open_session()
    before = len(stack.engine.calls)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Could you compute (2+3)*4 ?"}]
    with stack.anthropic_client(sid) as api:
        if stream:
            with api.messages.stream(model="p", max_tokens=256, tools=TOOLS, messages=messages) as s:  # type: ignore[arg-type]
                first = s.get_final_message()
        else:
            first = api.messages.create(model="p", max_tokens=256, tools=TOOLS, messages=messages)  # type: ignore[arg-type]
        assert first.stop_reason == "tool_use"
        assert [b.type for b in first.content] == ["text", "tool_use"]
        text, use = first.content
        assert text.text == "Let me use the calculator."  # type: ignore[union-attr]
        assert use.name == "calculator"  # type: ignore[union-attr]
        assert use.input == {"expression": "(2+3)*4"}  # type: ignore[union-attr]
        assert use.id.startswith("toolu_")  # type: ignore[union-attr]
        messages += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "20"}],  # type: ignore[union-attr]
            },
        ]
        final = api.messages.create(model="p", max_tokens=256, tools=TOOLS, messages=messages)  # type: ignore[arg-type]
    assert final.content[0].text == "The answer is 20."  # type: ignore[union-attr]
    calls = stack.engine.calls[before:]
    assert len(calls) == 2
    turns = stack.manager.turns(sid)
    assert [t.parent for t in turns] == [None, turns[0].id]
    assert stack.manager.drifts(sid) == []
    (sample,) = stack.manager.samples(sid)
    assert_sample_is_chain(sample, calls)


def test_tool_choice_absent_tools_means_plain_text(stack: Stack) -> None:
    """Without tools offered, tool-call-looking text is just text."""
    sid = stack.manager.open_session()
    text = '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>'
    with stack.anthropic_client(sid) as api:
        reply = api.messages.create(model="p", max_tokens=256, messages=[{"role": "user", "content": text}])
    assert reply.stop_reason == "end_turn"
    assert reply.content[0].text == f"You said: {text}"  # type: ignore[union-attr]


def test_stream_failure_is_an_error_event_and_records_nothing(stack: Stack) -> None:
    import anthropic

    sid = stack.manager.open_session()
    stack.engine.faults.append("truncated_stream")
    with anthropic.Anthropic(base_url=stack.adapter_url, api_key=sid, max_retries=0, timeout=20) as api:
        with (
            pytest.raises(anthropic.APIStatusError, match=r"truncated"),
            api.messages.stream(model="p", max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as s,
        ):
            list(s.text_stream)
        assert stack.manager.turns(sid) == []
        with pytest.raises(anthropic.AuthenticationError, match="unknown session"):
            api.messages.create(
                model="p",
                max_tokens=8,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"x-api-key": "nope"},
            )


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
