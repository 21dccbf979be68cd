"""Conversation → prompt text, in a ChatML-style template with tools in the system block.

Two entry points: `render` writes a whole conversation (the first turn of a
trajectory, or after drift), and `continuation` writes only what follows a
turn the policy generated, so earlier tokens are reused exactly instead of
re-tokenized (re-tokenizing generated text can change its ids).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from slime.agent.messages import Message, ToolSpec
from slime.agent.tokenizer import IM_END, IM_START

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


def _tools_section(tools: Sequence[ToolSpec]) -> str:
    listing = "\n".join(json.dumps(t.as_dict(), ensure_ascii=False) for t in tools)
    return (
        "## Available tools\n"
        "Call a tool by writing one block per call, with the tool's name and a JSON "
        "object of arguments:\n"
        f'{TOOL_CALL_OPEN}\n{{"name": "<tool name>", "arguments": {{...}}}}\n{TOOL_CALL_CLOSE}\n'
        f"The tools:\n<tools>\n{listing}\n</tools>"
    )


def render_tool_call(name: str, arguments: str) -> str:
    """One tool call as the policy is taught to write it."""
    call = f'{{"name": {json.dumps(name)}, "arguments": {arguments}}}'
    return f"{TOOL_CALL_OPEN}\n{call}\n{TOOL_CALL_CLOSE}"


def _assistant_body(message: Message) -> str:
    parts = [message.content] if message.content else []
    parts += [render_tool_call(c.name, c.arguments) for c in message.tool_calls]
    return "\n".join(parts)


def _blocks(messages: Sequence[Message]) -> list[str]:
    out: list[str] = []
    pending_results: list[str] = []

    def flush() -> None:
        if pending_results:
            out.append(f"{IM_START}user\n" + "\n".join(pending_results) + f"{IM_END}\n")
            pending_results.clear()

    for m in messages:
        if m.role == "tool":
            # Consecutive tool results share one user block, as parallel calls are answered.
            pending_results.append(f"<tool_response>\n{m.content}\n</tool_response>")
            continue
        flush()
        body = _assistant_body(m) if m.role == "assistant" else m.content
        out.append(f"{IM_START}{m.role}\n{body}{IM_END}\n")
    flush()
    return out


def render(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
    """A whole conversation, ending with the header of the assistant turn to generate."""
    messages = list(messages)
    if tools:
        section = _tools_section(tools)
        if messages and messages[0].role == "system":
            first = messages[0]
            messages[0] = Message(role="system", content=f"{first.content}\n\n{section}")
        else:
            messages.insert(0, Message(role="system", content=section))
    return "".join(_blocks(messages)) + f"{IM_START}assistant\n"


def continuation(messages: Sequence[Message], *, previous_closed: bool) -> str:
    """What follows a generated turn: its end marker if the engine did not emit one, then
    the new messages and the next assistant header."""
    head = "" if previous_closed else IM_END
    return head + "\n" + "".join(_blocks(messages)) + f"{IM_START}assistant\n"
