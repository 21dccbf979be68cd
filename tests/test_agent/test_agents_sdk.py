"""An OpenAI Agents SDK `Runner` with a function tool, against the adapter over loopback HTTP.

The agent is unmodified SDK code: only its client's base URL and API key
point at the adapter. Tracing is disabled (the SDK would otherwise export
traces to a remote service).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from _checks import assert_sample_is_chain
from _engine import calculator_policy
from _servers import Stack, running_stack

NUM_GPUS = 0


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack(calculator_policy) as s:
        yield s


def make_agent(stack: Stack, session: str, tool_log: list[str]) -> tuple[Any, Any, Any]:
    # Imported late: the SDK loads anyio, a pytest plugin that pytest must import first.
    import agents
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)

    @agents.function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        tool_log.append(expression)
        assert set(expression) <= set("0123456789+-*/() ")
        return str(eval(expression))  # checked above to be arithmetic only

    client = AsyncOpenAI(base_url=f"{stack.adapter_url}/v1", api_key=session, max_retries=0, timeout=20)
    model = agents.OpenAIChatCompletionsModel(model="slime-policy", openai_client=client)
    agent = agents.Agent(
        name="arithmetic",
        instructions="Use the calculator for arithmetic.",
        model=model,
        tools=[calculator],
        model_settings=agents.ModelSettings(temperature=0.9, max_tokens=200),
    )
    return agent, agents.RunConfig(tracing_disabled=True), client


def test_runner_tool_round_trip_becomes_one_sample(stack: Stack) -> None:
    import agents

    sid = stack.manager.open_session(task="6*7")
    tool_log: list[str] = []
    agent, config, client = make_agent(stack, sid, tool_log)
    before = len(stack.engine.calls)

    async def go() -> Any:
        async with client:
            return await agents.Runner.run(agent, "Please compute 6*7 now.", run_config=config, max_turns=4)

    result = asyncio.run(asyncio.wait_for(go(), 30))
    assert result.final_output == "The answer is 42."
    assert tool_log == ["6*7"]
    calls = stack.engine.calls[before:]
    assert len(calls) == 2
    assert all(c.sampling_params["temperature"] == 0.9 for c in calls)
    assert all(c.sampling_params["max_new_tokens"] == 200 for c in calls)
    prompt = stack.engine.tokenizer.decode(list(calls[0].prompt_ids), skip_special=False)
    assert prompt.startswith("<|im_start|>system\nUse the calculator for arithmetic.")
    # The SDK resent our assistant turn verbatim: no drift, one chain.
    assert stack.manager.drifts(sid) == []
    (sample,) = stack.manager.samples(sid)
    assert sample.metadata == {"task": "6*7"}
    assert_sample_is_chain(sample, calls)


def test_streamed_runner_emits_text_and_tool_events(stack: Stack) -> None:
    import agents

    sid = stack.manager.open_session()
    tool_log: list[str] = []
    agent, config, client = make_agent(stack, sid, tool_log)
    before = len(stack.engine.calls)

    async def go() -> tuple[Any, list[str], str]:
        async with client:
            run = agents.Runner.run_streamed(agent, "Please compute 12*12", run_config=config, max_turns=4)
            kinds: list[str] = []
            text = ""
            async for event in run.stream_events():
                if event.type == "run_item_stream_event":
                    kinds.append(event.item.type)
                elif event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                    text += event.data.delta
            return run, kinds, text

    run, kinds, text = asyncio.run(asyncio.wait_for(go(), 30))
    assert run.final_output == "The answer is 144."
    assert tool_log == ["12*12"]
    assert kinds == ["message_output_item", "tool_call_item", "tool_call_output_item", "message_output_item"]
    assert text == "Let me use the calculator.The answer is 144."
    calls = stack.engine.calls[before:]
    assert [c.streamed for c in calls] == [True, True]
    (sample,) = stack.manager.samples(sid)
    assert_sample_is_chain(sample, calls)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
