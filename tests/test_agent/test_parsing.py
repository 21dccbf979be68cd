"""Model output parsing, streamed-content safety, the tokenizer, the template, engine replies."""

from __future__ import annotations

import sys

import pytest

from slime.agent import chat_template
from slime.agent.engine import EngineError, parse_generation
from slime.agent.messages import Message, ToolCall, ToolSpec
from slime.agent.parsing import ContentStreamer, ParsedCall, parse_output
from slime.agent.tokenizer import IM_END, IM_START, ByteTokenizer

NUM_GPUS = 0
TOOLS = {"search", "calculator"}


def test_json_tool_call_in_tags() -> None:
    out = parse_output(
        'Looking it up.\n<tool_call>\n{"name": "search", "arguments": {"q": "Paris"}}\n</tool_call>',
        tool_names=TOOLS,
    )
    assert out.content == "Looking it up."
    assert out.calls == (ParsedCall(name="search", arguments={"q": "Paris"}),)
    assert out.problems == ()


def test_several_calls_keep_their_order_and_string_arguments_are_read() -> None:
    text = (
        '<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"a\\"}"}</tool_call>'
        '<tool_call>{"name": "calculator", "parameters": {"expression": "1+1"}}</tool_call>'
    )
    out = parse_output(text, tool_names=TOOLS)
    assert [c.name for c in out.calls] == ["search", "calculator"]
    assert out.calls[0].arguments == {"q": "a"}
    assert out.calls[1].arguments == {"expression": "1+1"}
    assert out.content == ""


def test_xml_style_calls_with_and_without_wrapper() -> None:
    wrapped = "<tool_call>\n<function=search>\n<parameter=q>\nthe Louvre\n</parameter>\n<parameter=n>3</parameter>\n</function>\n</tool_call>"
    bare = "Sure. <function=calculator><parameter=expression>2*3</parameter></function>"
    assert parse_output(wrapped, tool_names=TOOLS).calls == (
        ParsedCall(name="search", arguments={"q": "the Louvre", "n": 3}),
    )
    out = parse_output(bare, tool_names=TOOLS)
    assert out.calls == (ParsedCall(name="calculator", arguments={"expression": "2*3"}),)
    assert out.content == "Sure."


def test_whole_output_json_is_a_call_only_when_it_names_a_tool() -> None:
    assert parse_output('{"name": "search", "arguments": {"q": "x"}}', tool_names=TOOLS).calls == (
        ParsedCall(name="search", arguments={"q": "x"}),
    )
    listed = parse_output(
        '[{"name": "search", "arguments": {}}, {"name": "calculator", "arguments": {}}]', tool_names=TOOLS
    )
    assert len(listed.calls) == 2
    plain = parse_output('{"answer": 42}', tool_names=TOOLS)
    assert plain.calls == () and plain.content == '{"answer": 42}'
    unknown = parse_output('{"name": "rm", "arguments": {}}', tool_names=TOOLS)
    assert unknown.calls == () and unknown.problems == ("unknown tool 'rm'",)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('<tool_call>{"name": "search", "arguments": {</tool_call>', "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "needs a string 'name'"),
        ('<tool_call>{"name": "search", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "search", "arguments": "nope"}</tool_call>', "string that is not JSON"),
        ('<tool_call>{"name": "launch", "arguments": {}}</tool_call>', "unknown tool 'launch'"),
        ("<function=search>stray text</function>", "unexpected text"),
        ('Going.\n<tool_call>\n{"name": "search", "argum', "unclosed <tool_call>"),
    ],
)
def test_malformed_blocks_stay_text_and_are_named(text: str, problem: str) -> None:
    out = parse_output(text, tool_names=TOOLS)
    assert out.calls == ()
    assert out.content == text.strip()
    assert any(problem in p for p in out.problems), out.problems


def test_a_bad_block_does_not_hide_a_good_one() -> None:
    text = '<tool_call>{oops}</tool_call> then <tool_call>{"name": "search", "arguments": {}}</tool_call>'
    out = parse_output(text, tool_names=TOOLS)
    assert out.calls == (ParsedCall(name="search", arguments={}),)
    assert out.content == "<tool_call>{oops}</tool_call> then"
    assert len(out.problems) == 1


def test_without_tools_everything_is_text() -> None:
    text = '<tool_call>{"name": "search", "arguments": {}}</tool_call>'
    assert parse_output(f"  {text}  ", tool_names=set()).content == text


def stream_all(text: str, *, step: int, tools: bool) -> tuple[str, str]:
    streamer = ContentStreamer(tools_offered=tools)
    sent = "".join(streamer.feed(text[:k]) for k in range(step, len(text) + step, step))
    parsed = parse_output(text, tool_names=TOOLS if tools else set())
    return sent, sent + streamer.finish(parsed)


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_streamed_content_never_shows_a_tool_block_and_sums_to_the_parse(step: int) -> None:
    text = '  Let me check <the> docs.\n\n<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>\n'
    sent, total = stream_all(text, step=step, tools=True)
    assert "<tool_call" not in sent and "<t" not in sent.replace("<the>", "")
    assert total == parse_output(text, tool_names=TOOLS).content == "Let me check <the> docs."


@pytest.mark.parametrize(
    "text",
    [
        "plain answer with trailing space   ",
        '{"name": "search", "arguments": {}}',
        "<function=search><parameter=q>x</parameter></function> after",
        "Result <tool_call>{bad}</tool_call> end",
    ],
)
def test_streamed_plus_finish_equals_parsed_content(text: str) -> None:
    for step in (1, 4):
        _, total = stream_all(text, step=step, tools=True)
        assert total == parse_output(text, tool_names=TOOLS).content
        _, plain = stream_all(text, step=step, tools=False)
        assert plain == text.strip()


def test_a_stop_string_is_never_streamed_even_in_part() -> None:
    # The engine streams raw text; its final text drops the stop string.
    streamer = ContentStreamer(tools_offered=False, stops=["END"])
    raw = "alpha beta ENDgamma"
    sent = "".join(streamer.feed(raw[:k]) for k in range(1, len(raw) + 1))
    final = "alpha beta "
    assert sent == "alpha beta"
    assert sent + streamer.finish(parse_output(final, tool_names=set())) == "alpha beta"
    held = ContentStreamer(tools_offered=False, stops=["END"])
    assert held.feed("alpha EN") == "alpha"  # "EN" may be the start of the stop string


def test_byte_tokenizer_round_trips_and_knows_its_specials() -> None:
    tok = ByteTokenizer()
    text = f"{IM_START}user\nnaïve ☃ café{IM_END}\n"
    ids = tok.encode(text)
    assert ids[0] == tok.token_id(IM_START)
    assert ids.count(tok.token_id(IM_END)) == 1
    assert tok.decode(ids, skip_special=False) == text
    assert tok.decode(ids) == "user\nnaïve ☃ café\n"
    assert tok.eos_ids == {tok.token_id(IM_END), tok.token_id("<|endoftext|>")}
    assert tok.decode(list("é".encode())[:1]) == "\ufffd"  # half a character never raises
    with pytest.raises(ValueError, match="outside this tokenizer's vocabulary"):
        tok.decode([tok.vocab_size])


def test_template_renders_tools_results_and_continuations() -> None:
    tools = [ToolSpec.make(name="search", description="Find.", parameters={"type": "object"})]
    call = ToolCall.make(id="c1", name="search", arguments={"q": "x"})
    messages = [
        Message(role="system", content="Be brief."),
        Message(role="user", content="Q"),
        Message(role="assistant", content="Looking.", tool_calls=(call,)),
        Message(role="tool", content="r1", tool_call_id="c1"),
        Message(role="tool", content="r2", tool_call_id="c1"),
    ]
    text = chat_template.render(messages, tools)
    assert text.startswith(f"{IM_START}system\nBe brief.\n\n## Available tools")
    assert '{"name": "search", "description": "Find.", "parameters": {"type": "object"}}' in text
    assert (
        f'Looking.\n<tool_call>\n{{"name": "search", "arguments": {{"q":"x"}}}}\n</tool_call>{IM_END}' in text
    )
    # Parallel results share one user block.
    assert (
        f"{IM_START}user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response>{IM_END}\n"
        in text
    )
    assert text.endswith(f"{IM_START}assistant\n")
    head = chat_template.render(messages[:2], tools)
    # A continuation after a generated turn is exactly what a whole render would add.
    generated = f"Looking.\n{chat_template.render_tool_call('search', call.arguments)}{IM_END}"
    tail = chat_template.continuation(messages[3:], previous_closed=True)
    assert head + generated + tail == text
    assert chat_template.continuation([], previous_closed=False).startswith(IM_END + "\n")


def reply(**meta: object) -> dict[str, object]:
    base: dict[str, object] = {
        "finish_reason": {"type": "stop", "matched": 258},
        "output_token_logprobs": [[-0.5, 7, None]],
    }
    return {"text": "a", "output_ids": [7], "meta_info": {**base, **meta}}


def test_engine_reply_validation() -> None:
    gen = parse_generation(reply(), final=True)
    assert gen.output_ids == (7,) and gen.logprobs == (-0.5,) and gen.finish_kind == "stop"
    bad = [
        ([], "not a JSON object"),
        ({"error": "oom"}, "engine reported an error"),
        ({"text": 1, "output_ids": [], "meta_info": {}}, "no string 'text'"),
        ({"text": "", "output_ids": [-1], "meta_info": {}}, "list of token ids"),
        (reply(output_token_logprobs=[[-0.5, 8, None]]), "bad log-prob entry"),
        (reply(output_token_logprobs=[[0.5, 7, None]]), "bad log-prob entry"),
        (reply(output_token_logprobs=[[float("nan"), 7, None]]), "bad log-prob entry"),
        (reply(output_token_logprobs=[]), "do not match"),
        (reply(finish_reason={"type": "weird"}), "unknown finish_reason"),
        (reply(finish_reason={"type": "abort", "message": "bye"}), "aborted the request: bye"),
        (reply(finish_reason=None), "without a finish_reason"),
    ]
    for payload, message in bad:
        with pytest.raises(EngineError, match=message):
            parse_generation(payload, final=True)
    assert parse_generation(reply(finish_reason=None), final=False).finish_kind is None


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
