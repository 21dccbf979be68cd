"""What the monitor's issues are made of: their kinds, the marker that finds one again, who
owns an entry (the registry, else CODEOWNERS), and an issue that should be open (`Wanted`).

Shared by the issues of held and main-breaking entries (ci/github/flaky_issues.py) and of
selection leaks (ci/github/leak_issues.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

IssueKind = Literal["flaky", "broken-main", "selection-leak"]
# Per kind: the title's lead, why an issue opens, why one is rewritten, what reopens one.
WORDS: dict[str, tuple[str, str, str, str]] = {
    "flaky": ("Flaky", "held by the quarantine", "still held", "flaked"),
    "broken-main": ("Failing on main", "failing on main", "still failing on main", "failed on main"),
    "selection-leak": ("Selection would miss", "the selection would miss its catch",
                       "still missed by the selection", "missed by the selection"),
}
MARKER_RE = re.compile(r"<!-- slime-ci:entry=(.+?) kind=(flaky|broken-main|selection-leak) -->")
CODEOWNERS_PATHS = (".github/CODEOWNERS", "CODEOWNERS", "docs/CODEOWNERS")

# In the marker an entry id keeps no `>` (which would end the HTML comment early and show the
# rest), no `<`, no line break; `%` is encoded so that decoding gives the id back.
_MARKER_ESCAPES = {"%": "%25", ">": "%3E", "<": "%3C", "\n": "%0A", "\r": "%0D"}


def marker(entry_id: str, kind: IssueKind) -> str:
    safe = "".join(_MARKER_ESCAPES.get(c, c) for c in entry_id)
    return f"<!-- slime-ci:entry={safe} kind={kind} -->"


# --- owners -----------------------------------------------------------------------------------

def _pattern(raw: str) -> re.Pattern[str]:
    """A CODEOWNERS pattern (gitignore-like) as a regular expression over repository paths."""
    body = raw.strip("/")
    rx = ""
    i = 0
    while i < len(body):
        if body.startswith("**", i):
            rx, i = rx + ".*", i + 2
        elif body[i] == "*":
            rx, i = rx + "[^/]*", i + 1
        elif body[i] == "?":
            rx, i = rx + "[^/]", i + 1
        else:
            rx, i = rx + re.escape(body[i]), i + 1
    anywhere = not raw.startswith("/") and "/" not in body
    return re.compile(("(?:.*/)?" if anywhere else "") + rx + "(?:/.*)?")


def codeowners(root: Path) -> list[tuple[re.Pattern[str], tuple[str, ...]]]:
    """The rules of the repository's CODEOWNERS file, in file order (the last match wins)."""
    for rel in CODEOWNERS_PATHS:
        path = root / rel
        if path.is_file():
            rules = []
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                parts = line.split("#", 1)[0].split()
                if parts:
                    rules.append((_pattern(parts[0]), tuple(parts[1:])))
            return rules
    return []


def owner_of(path: str, entry_owner: str, suite_owner: str,
             rules: Sequence[tuple[re.Pattern[str], tuple[str, ...]]]) -> str:
    """Who answers for an entry: the registry's word first, then CODEOWNERS' last matching rule."""
    if entry_owner or suite_owner:
        return entry_owner or suite_owner
    found: tuple[str, ...] = ()
    for rx, owners in rules:
        if rx.fullmatch(path):
            found = owners
    return " ".join(found)


@dataclass(frozen=True, kw_only=True)
class Wanted:
    """An issue that should be open: its entry, kind, title and body."""

    entry_id: str
    kind: IssueKind
    title: str
    body: str
    owner: str
    since: float  # when what it reports last happened (a flake, a failure on main)
    suites: tuple[str, ...] = ()
    by_registry: bool = False  # held by Entry.quarantine, not by its rate
