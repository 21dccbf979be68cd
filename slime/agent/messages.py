"""The provider-neutral conversation model every adapter translates into.

OpenAI and Anthropic shape the same conversation differently (tool results
as `tool` messages vs `tool_result` blocks, arguments as a JSON string vs an
object). Each adapter translates into these records once, so rendering,
trajectory matching and drift detection are written once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from slime.utils.strict_json import JSONBodyError, loads_strict

Role = Literal["system", "user", "assistant", "tool"]


class BadRequest(ValueError):
    """A request the agent must fix; the adapter answers it with HTTP 400."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def canonical_json(value: Any) -> str:
    """One JSON spelling for a value, so resent arguments compare equal to generated ones."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One function call the policy made; `arguments` is a JSON object in canonical text."""

    id: str
    name: str
    arguments: str

    @classmethod
    def make(cls, *, id: str, name: str, arguments: Mapping[str, Any]) -> ToolCall:
        """Build a call from parsed arguments."""
        return cls(id=id, name=name, arguments=canonical_json(dict(arguments)))

    def arguments_dict(self) -> dict[str, Any]:
        """The arguments as a dict."""
        value = json.loads(self.arguments)
        assert isinstance(value, dict)
        return value


@dataclass(frozen=True, kw_only=True)
class Message:
    """One conversation message, whatever provider it came from."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # on role "tool": which call this answers


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A tool the agent offers: name, description and a JSON-schema of its arguments."""

    name: str
    description: str = ""
    parameters_json: str = '{"type":"object","properties":{}}'

    @classmethod
    def make(cls, *, name: str, description: str, parameters: Mapping[str, Any]) -> ToolSpec:
        """Build a spec from a schema dict."""
        return cls(name=name, description=description, parameters_json=canonical_json(dict(parameters)))

    def as_dict(self) -> dict[str, Any]:
        """The spec as the prompt shows it."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": json.loads(self.parameters_json),
        }


def parse_arguments(raw: Any, *, param: str) -> dict[str, Any]:
    """Tool-call arguments from a JSON string or an object; anything else is a BadRequest."""
    if isinstance(raw, str):
        try:
            raw = loads_strict(raw.encode()) if raw.strip() else {}
        except JSONBodyError as exc:
            raise BadRequest(f"{param} is not valid JSON: {exc}", param=param) from None
    if not isinstance(raw, dict):
        raise BadRequest(f"{param} must be a JSON object", param=param)
    return raw
