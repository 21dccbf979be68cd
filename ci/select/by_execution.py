"""Which entries of a labelled suite a diff can reach, by what each entry executed.

The static import graph cannot narrow a GPU suite: every entry imports `slime` through
the training loop. What an entry *executed* can (`ci.select.executed`). A diff's hunks are
mapped to the def/class they fall in (a change at module level counts as the whole file);
an entry runs when it executed one of them, when its own file changed, when it has no
record yet, or — every entry — when the diff touches a leak path (a file that changes
behaviour without running as code: pyproject, constraints, noxfile, conftest, the
registry, Dockerfiles, non-Python files under slime/). Pure: the caller reads git.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from ci.registry.model import SelectionPolicy
from ci.select.executed import MODULE, Record, changed_functions, scopes

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
WHOLE_FILE: frozenset[str] = frozenset({MODULE})
SHOWN_REASONS = 3  # functions named in one reason; the rest counted


@dataclass(frozen=True, kw_only=True)
class FileDiff:
    """One file of a unified diff: its two names and the lines each side changed."""

    old_path: str | None  # None: the file is new
    new_path: str | None  # None: the file was deleted
    old_lines: frozenset[int]  # removed or replaced lines, old numbering
    new_lines: frozenset[int]  # added lines, new numbering
    insert_after: frozenset[int]  # old lines after which a pure insertion comes


@dataclass(frozen=True, kw_only=True)
class Change:
    """What a diff changed in one file: its functions, or the whole file (`WHOLE_FILE`)."""

    path: str
    functions: frozenset[str]


@dataclass(frozen=True, kw_only=True)
class Pick:
    """One entry of a suite: whether the diff can reach it, and why (or why not)."""

    entry: str
    runs: bool
    reason: str


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


def changes(files: Iterable[FileDiff], read_old: Callable[[str], str | None],
            read_new: Callable[[str], str | None]) -> tuple[Change, ...]:
    """Each changed file's functions: removed lines in the old source, added lines in the new.
    A file that is not Python, new, deleted, renamed or unparsable counts as a whole."""
    out: dict[str, set[str]] = {}
    for f in files:
        path = f.new_path or f.old_path
        assert path is not None
        if f.old_path is not None and f.new_path is not None and f.old_path != f.new_path:
            out.setdefault(f.old_path, set()).update(WHOLE_FILE)
        if not path.endswith(".py") or f.old_path is None or f.new_path is None:
            out.setdefault(path, set()).update(WHOLE_FILE)
            continue
        old_src, new_src = read_old(f.old_path), read_new(f.new_path)
        found: set[str] = set()
        old_scopes = scopes(old_src) if old_src is not None else ()
        new_scopes = scopes(new_src) if new_src is not None else ()
        if old_src is None or not old_scopes:  # unreadable, unparsable, or no def at all
            found |= WHOLE_FILE
        else:
            found |= changed_functions(old_scopes, f.old_lines)
            if new_src is not None:
                found |= changed_functions(new_scopes, f.new_lines)
            else:  # no new side to read: an insertion counts for the scopes on both sides of it
                found |= changed_functions(old_scopes, {m for a in f.insert_after for m in (a, a + 1)})
        out.setdefault(path, set()).update(found)
    return tuple(Change(path=p, functions=frozenset(fns)) for p, fns in sorted(out.items()))


def whole_files(paths: Iterable[str]) -> tuple[Change, ...]:
    """Changed paths without their hunks (`plan --paths`): each counts as a whole."""
    return tuple(Change(path=p, functions=WHOLE_FILE) for p in sorted(set(paths)))


def leak(path: str, policy: SelectionPolicy) -> bool:
    """Whether a changed path changes behaviour without being executed as code."""
    if any(fnmatch.fnmatchcase(path, g) for g in policy.leak_paths):
        return True
    p = PurePosixPath(path)
    return p.suffix != ".py" and any(p.is_relative_to(d) for d in policy.non_python_leaks_under)


def _hits(change: Change, record: Record) -> list[str]:
    ran = record.files.get(change.path)
    if ran is None:
        return []
    if MODULE in change.functions:
        return [f"{change.path} (module level changed)"]
    return [f"{change.path}:{fn}" for fn in sorted(change.functions & set(ran))]


def pick(entries: Sequence[tuple[str, str]], diff: Sequence[Change],
         records: Mapping[str, Record], policy: SelectionPolicy) -> tuple[Pick, ...]:
    """Each entry (id, its file) with whether the diff can reach it and the reason."""
    leaks = [c.path for c in diff if leak(c.path, policy)]
    changed = {c.path for c in diff}
    out = []
    for entry, path in entries:
        record = records.get(entry)
        if leaks:
            out.append(Pick(entry=entry, runs=True, reason=f"leak path {leaks[0]}"))
        elif path in changed:
            out.append(Pick(entry=entry, runs=True, reason=f"own file {path} changed"))
        elif record is None:
            out.append(Pick(entry=entry, runs=True, reason="no record"))
        else:
            hits = [h for c in diff for h in _hits(c, record)]
            more = f" and {len(hits) - SHOWN_REASONS} more" if len(hits) > SHOWN_REASONS else ""
            out.append(Pick(entry=entry, runs=bool(hits),
                            reason="executes " + ", ".join(hits[:SHOWN_REASONS]) + more if hits
                            else "executes none of the changed code"))
    return tuple(out)
