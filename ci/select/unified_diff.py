"""A unified diff's files and the lines each side changed (`git diff -U0`, a plant's patch).

Shared by the selection rule (`ci.select.by_execution`) and the line map between two
versions of a file (`ci.select.blocks`). Pure.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True, kw_only=True)
class FileDiff:
    """One file of a unified diff: its two names and the lines each side changed."""

    old_path: str | None  # None: the file is new
    new_path: str | None  # None: the file was deleted
    old_lines: frozenset[int]  # removed or replaced lines, old numbering
    new_lines: frozenset[int]  # added lines, new numbering
    insert_after: frozenset[int]  # old lines after which a pure insertion comes


def parse_diff(text: str) -> tuple[FileDiff, ...]:
    """The files of a unified diff (`git diff`, a plant's patch) with their changed lines."""
    out: list[FileDiff] = []
    old: str | None = None
    new: str | None = None
    olds: set[int] = set()
    news: set[int] = set()
    after: set[int] = set()
    started = False
    o = n = 0

    def flush() -> None:
        if started:
            out.append(FileDiff(old_path=old, new_path=new, old_lines=frozenset(olds),
                                new_lines=frozenset(news), insert_after=frozenset(after)))

    for line in text.splitlines():
        if line.startswith("diff --git "):
            flush()
            started, olds, news, after = True, set(), set(), set()
            parts = line.split(" ")
            old, new = parts[2][2:], parts[-1][2:]
        elif line.startswith("--- ") and started:
            old = None if line[4:].strip() == "/dev/null" else line[4:].strip().removeprefix("a/")
        elif line.startswith("+++ ") and started:
            new = None if line[4:].strip() == "/dev/null" else line[4:].strip().removeprefix("b/")
        elif m := HUNK.match(line):
            o, n = int(m.group(1)), int(m.group(3))
            if m.group(2) == "0":
                after.add(o)  # -U0 pure insertion: after old line o
        elif started and line.startswith("-"):
            olds.add(o)
            o += 1
        elif started and line.startswith("+"):
            if not olds or o - 1 not in olds:
                after.add(o - 1)  # inserted after old line o-1 (with context lines)
            news.add(n)
            n += 1
        elif started and line.startswith(" "):
            o, n = o + 1, n + 1
    flush()
    return tuple(out)


def file_diff(old_path: str | None, new_path: str | None, old_text: str, new_text: str) -> FileDiff:
    """One file's FileDiff from its two texts (a patch applied here, not a diff git wrote)."""
    olds: set[int] = set()
    news: set[int] = set()
    after: set[int] = set()
    matcher = difflib.SequenceMatcher(a=old_text.splitlines(), b=new_text.splitlines(), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        olds.update(range(i1 + 1, i2 + 1))
        news.update(range(j1 + 1, j2 + 1))
        if i1 == i2:
            after.add(i1)  # a pure insertion after old line i1
    return FileDiff(old_path=old_path, new_path=new_path, old_lines=frozenset(olds),
                    new_lines=frozenset(news), insert_after=frozenset(after))
