"""Model output → text + tool calls, for JSON and XML-style tool-use blocks.

Accepted call forms (whatever the model writes, one call each):
  <tool_call>{"name": "f", "arguments": {...}}</tool_call>          JSON in tags
  <tool_call><function=f><parameter=x>1</parameter></function></tool_call>
  <function=f><parameter=x>1</parameter></function>                 XML-style
  {"name": "f", "arguments": {...}}  or a list of such, as the whole output
A block that cannot be read (bad JSON, unclosed tag, unknown tool) stays in the
text and is named in `problems`: a policy's malformed call is something the
agent should see, never a reason to fail the request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from slime.agent.chat_template import TOOL_CALL_CLOSE, TOOL_CALL_OPEN


@dataclass(frozen=True, kw_only=True)
class ParsedCall:
    """A call read from model output; arguments as a dict."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ParsedOutput:
    """The text the agent sees, the calls it should run, and what could not be read."""

    content: str
    calls: tuple[ParsedCall, ...] = ()
    problems: tuple[str, ...] = ()


_BLOCK = re.compile(
    r"<tool_call>(?P<tc>.*?)</tool_call>|<function=(?P<fn>[^>\n]+)>(?P<fbody>.*?)</function>",
    re.S,
)
_PARAM = re.compile(r"<parameter=(?P<k>[^>\n]+)>(?P<v>.*?)</parameter>", re.S)
_XML_FUNC = re.compile(r"\s*<function=(?P<fn>[^>\n]+)>(?P<fbody>.*?)</function>\s*", re.S)


class _Unreadable(ValueError):
    pass


def _call_from_obj(obj: Any) -> ParsedCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise _Unreadable("a call needs a string 'name'")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise _Unreadable("'arguments' is a string that is not JSON") from None
    if not isinstance(args, dict):
        raise _Unreadable("'arguments' must be a JSON object")
    return ParsedCall(name=obj["name"], arguments=args)


def _xml_call(name: str, body: str) -> ParsedCall:
    args: dict[str, Any] = {}
    for p in _PARAM.finditer(body):
        raw = p.group("v").strip()
        try:
            args[p.group("k").strip()] = json.loads(raw)
        except json.JSONDecodeError:
            args[p.group("k").strip()] = raw  # XML-style values are often bare strings
    leftover = _PARAM.sub("", body).strip()
    if leftover:
        raise _Unreadable(f"unexpected text inside <function={name}>")
    return ParsedCall(name=name.strip(), arguments=args)


def _tagged_call(body: str) -> ParsedCall:
    xml = _XML_FUNC.fullmatch(body)
    if xml:
        return _xml_call(xml.group("fn"), xml.group("fbody"))
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        raise _Unreadable(f"tool call is not valid JSON ({exc.msg})") from None
    return _call_from_obj(obj)


def _whole_output_calls(text: str) -> list[ParsedCall] | None:
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return None
    try:
        obj = json.loads(stripped)
    except json.JSONDecodeError:
        return None
    items = obj if isinstance(obj, list) else [obj]
    try:
        return [_call_from_obj(o) for o in items] if items else None
    except _Unreadable:
        return None  # plain JSON the model meant as text


def parse_output(text: str, *, tool_names: Collection[str]) -> ParsedOutput:
    """Split generated text into content and calls; with no tools offered, all of it is text."""
    if not tool_names:
        return ParsedOutput(content=text.strip())
    calls: list[ParsedCall] = []
    problems: list[str] = []
    kept: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        kept.append(text[pos : m.start()])
        pos = m.end()
        try:
            if m.group("tc") is not None:
                call = _tagged_call(m.group("tc").strip())
            else:
                call = _xml_call(m.group("fn"), m.group("fbody"))
            if call.name not in tool_names:
                raise _Unreadable(f"unknown tool {call.name!r}")
        except _Unreadable as exc:
            problems.append(str(exc))
            kept.append(m.group(0))
            continue
        calls.append(call)
    kept.append(text[pos:])
    content = "".join(kept)
    if TOOL_CALL_OPEN in content and TOOL_CALL_CLOSE not in content[content.rfind(TOOL_CALL_OPEN) :]:
        problems.append("unclosed <tool_call> block (output cut short?)")
    if not calls and not problems:
        whole = _whole_output_calls(text)
        if whole is not None:
            unknown = [c.name for c in whole if c.name not in tool_names]
            if not unknown:
                return ParsedOutput(content="", calls=tuple(whole))
            problems.append(f"unknown tool {unknown[0]!r}")
    return ParsedOutput(content=content.strip(), calls=tuple(calls), problems=tuple(problems))


_MARKERS = (TOOL_CALL_OPEN, "<function=")


class ContentStreamer:
    """Streams generated text to the agent without ever showing part of a tool-call block.

    Fed the cumulative text, `feed` returns the new part that is certainly content:
    it stops before any marker (or a prefix of one at the end) and holds back
    trailing whitespace, because the final content is stripped. `finish` returns
    the rest of the parsed content, so streamed + finish == parsed content.
    """

    def __init__(self, *, tools_offered: bool, stops: Sequence[str] = ()) -> None:
        self._tools = tools_offered
        # Stop strings count as markers too: the engine's final text leaves them out, so a
        # partly streamed stop string would be text the agent saw and the record lacks.
        self._markers = (*(_MARKERS if tools_offered else ()), *(s for s in stops if s))
        self._sent = ""
        self._closed = False  # a marker or whole-output JSON was seen: stream nothing more

    def _safe_prefix(self, text: str) -> str:
        text = text.lstrip()
        if self._tools and text.startswith(("{", "[")):
            self._closed = True
            return ""
        cut = len(text)
        for marker in self._markers:
            i = text.find(marker)
            if i >= 0:
                self._closed = True
                cut = min(cut, i)
            # A marker may be arriving: hold back a tail that could start one.
            for k in range(min(len(marker) - 1, len(text)), 0, -1):
                if text.endswith(marker[:k]):
                    cut = min(cut, len(text) - k)
                    break
        return text[:cut].rstrip()

    def feed(self, cumulative_text: str) -> str:
        """New content to send, given everything generated so far."""
        if self._closed:
            return ""
        safe = self._safe_prefix(cumulative_text)
        if not safe.startswith(self._sent) or len(safe) <= len(self._sent):
            return ""
        delta = safe[len(self._sent) :]
        self._sent = safe
        return delta

    def finish(self, parsed: ParsedOutput) -> str:
        """The content not yet sent, once the output is parsed."""
        if parsed.content.startswith(self._sent):
            return parsed.content[len(self._sent) :]
        return ""  # cannot happen by construction; never resend what the agent has
