"""JSON as HTTP servers here accept it: RFC 8259 only (no NaN/Infinity), nesting bounded, UTF-8.

Python's `json` module reads `NaN` and `Infinity` (a `"temperature": NaN` then sampled
garbage) and recurses once per nesting level (a 100,000-deep body raised `RecursionError`).
The depth is checked before parsing, on the bytes with the string literals blanked out, so
the check is linear and runs at C speed.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


class JSONBodyError(ValueError):
    """A body that is not strict JSON; the message says what is wrong."""


def _reject_constant(name: str) -> Any:
    raise JSONBodyError(f"{name} is not JSON; send a finite number")


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in `raw` (strings ignored)."""
    brackets = _STRING.sub(b'""', raw).translate(None, _NOT_BRACKET)
    depth = deepest = 0
    # Only the bracket bytes remain; a body of ids has two.
    for b in brackets:
        depth += 1 if b in (0x5B, 0x7B) else -1
        deepest = max(deepest, depth)
    return deepest


def loads_strict(raw: bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse `raw`; JSONBodyError for bad UTF-8, bad JSON, NaN/Infinity or nesting over `max_depth`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONBodyError(f"the body is not UTF-8: {exc.reason} at byte {exc.start}") from None
    # No more opening brackets than `max_depth` (a body of ids has two) cannot nest deeper:
    # counted at C speed, it spares the string scan of every ordinary request.
    if raw.count(b"[") + raw.count(b"{") > max_depth:
        depth = nesting_depth(raw)
        if depth > max_depth:
            raise JSONBodyError(f"the body nests {depth} levels deep; at most {max_depth} are allowed")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except JSONBodyError:
        raise
    except ValueError as exc:  # JSONDecodeError, and ints longer than Python converts
        raise JSONBodyError(f"the body is not JSON: {exc}") from None
