"""Where a failed test's assertion is: its file and line, read from the JUnit report pytest wrote.

The runner reads it when the attempt ends and the history keeps it with the attempt
(`attempts.fail_path`, `attempts.fail_line`, schema 6), so the verdict job, which has no
report of its own, still annotates the failing line of a check run. A report is read as
test output: bounded, and a file that does not parse says nothing.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

MAX_JUNIT_BYTES = 8 << 20  # one report; a larger file is not read
MAX_PATH_CHARS = 1024  # as `attempts.path`
# pytest's traceback names each frame `path:line: ...`, its last line `path:line: ErrorType`.
_FRAME = re.compile(r"^(?P<path>[^\s:][^:\n]*\.py):(?P<line>\d+):", re.MULTILINE)
_LINE_MAX = 2**31 - 1


@dataclass(frozen=True, kw_only=True)
class Location:
    """Where a failed test's assertion is: a file of the repository and its line."""

    path: str
    line: int
    message: str = ""


def _frames(text: str, test_file: str) -> Location | None:
    """The last frame of the traceback in the test's own file (its assertion), else the last."""
    frames = [(m.group("path"), int(m.group("line"))) for m in _FRAME.finditer(text)]
    if not frames:
        return None
    own = [f for f in frames if test_file and (f[0] == test_file or f[0].endswith("/" + test_file)
                                               or test_file.endswith("/" + f[0]))]
    path, line = (own or frames)[-1]
    return Location(path=test_file if own else path, line=min(_LINE_MAX, max(1, line)))


def _test_file(classname: str, text: str) -> str:
    """The test's file from its JUnit classname (`tests.unit.test_x` or `tests.unit.test_x.TestY`):
    the longest dotted prefix that the traceback names as a file, else the whole name."""
    parts = classname.split(".")
    named = {m.group("path") for m in _FRAME.finditer(text)}
    for k in range(len(parts), 0, -1):
        candidate = "/".join(parts[:k]) + ".py"
        if candidate in named:
            return candidate
    return "/".join(parts) + ".py"


def junit_locations(doc: ET.Element, root: str = "") -> dict[str, Location]:
    """Per test file (its path as the entry names it), its first failure's assertion location.

    `root`: the directory pytest ran in, stripped from an absolute path in a traceback."""
    out: dict[str, Location] = {}
    for case in doc.iter("testcase"):
        bad = next((c for c in case if c.tag in ("failure", "error")), None)
        if bad is None:
            continue
        text = bad.text or ""
        test_file = case.get("file") or _test_file(case.get("classname") or "", text)
        found = _frames(text, test_file)
        if found is None:
            line = case.get("line")
            found = Location(path=test_file, line=int(line) + 1 if line and line.isdigit() else 1)
        path = found.path[len(root):].lstrip("/") if root and found.path.startswith(root) else found.path
        lines = text.strip().splitlines()
        message = (bad.get("message") or "").strip() or (lines[-1] if lines else "")
        out.setdefault(test_file, Location(path=path, line=found.line, message=message))
    return out


def parse_report(path: Path) -> ET.Element | None:
    """A JUnit report's root, or None: not a regular file, past MAX_JUNIT_BYTES, or not XML."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_JUNIT_BYTES:
            return None
        return ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None


def failure_site(report: Path | None, test_file: str, root: Path | None = None) -> tuple[str, int] | None:
    """The (path, line) of the first failure the report gives for `test_file`, as the history
    keeps it: a path inside the repository (relative, no `..`), else None."""
    if report is None:
        return None
    doc = parse_report(report)
    if doc is None:
        return None
    found = junit_locations(doc, f"{root}/" if root is not None else "")
    where = found.get(test_file) or (next(iter(found.values())) if len(found) == 1 else None)
    if where is None:
        return None
    path = where.path.replace("\x00", "")
    if path.startswith("/") or ".." in Path(path).parts or len(path) > MAX_PATH_CHARS or not path:
        return None
    return path, where.line
