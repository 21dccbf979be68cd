"""An unmodified SDK agent with a calculator tool, run as a subprocess by the rollout tests.

It knows nothing of slime: it reads the standard SDK variables (OPENAI_BASE_URL,
OPENAI_API_KEY), takes its task from SLIME_AGENT_TASK, loops until the model
stops calling tools, and prints the final answer.
"""

from __future__ import annotations

import json
import os
from typing import Any

SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}


def calculator(expression: str) -> str:
    if not set(expression) <= set("0123456789+-*/(). "):
        return "error: not arithmetic"
    return str(eval(expression))  # checked above to be arithmetic only


def run_openai(task: str) -> str:
    from openai import OpenAI

    tools: Any = [{"type": "function", "function": {"name": "calculator", "parameters": SCHEMA}}]
    messages: list[Any] = [{"role": "user", "content": task}]
    with OpenAI(max_retries=0, timeout=30) as client:
        for _ in range(5):
            reply = client.chat.completions.create(model="policy", messages=messages, tools=tools)
            message = reply.choices[0].message
            if not message.tool_calls:
                return message.content or ""
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                args = json.loads(call.function.arguments)  # type: ignore[union-attr]
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": calculator(args["expression"])}
                )
    raise SystemExit("no final answer after 5 turns")


if __name__ == "__main__":
    print(run_openai(os.environ["SLIME_AGENT_TASK"]))
