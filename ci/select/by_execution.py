"""Which entries of a labelled suite a diff can reach, by what each entry executed.

The static import graph cannot narrow a GPU suite: every entry imports `slime` through
the training loop. What an entry *executed* can (`ci.select.executed`). A diff's hunks are
mapped to the def/class they fall in (a change at module level counts as the whole file);
an entry runs when it executed one of them, when its own file changed, when it has no
record yet, or — every entry — when the diff touches a leak path (a file that changes
behaviour without running as code: pyproject, constraints, noxfile, conftest, the
registry, Dockerfiles, non-Python files under slime/). Where the record keeps the lines
an entry ran, a function it ran counts only when it also entered the block of statements
a change falls in (`ci.select.blocks`): a change to a branch it never took, or to a
comment, does not run it. Pure: the caller reads git (and gives `line_map`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from ci.registry.model import SelectionPolicy
from ci.select.blocks import LineMap, Region, entered, regions
from ci.select.executed import MODULE, Record, blob_id, changed_functions, parse_spans, scopes
from ci.select.unified_diff import FileDiff

WHOLE_FILE: frozenset[str] = frozenset({MODULE})
SHOWN_REASONS = 3  # functions named in one reason; the rest counted


@dataclass(frozen=True, kw_only=True)
class Change:
    """What a diff changed in one file: its functions, or the whole file (`WHOLE_FILE`); and,
    where both sides could be read, the blocks its changes fall in (`ci.select.blocks`),
    numbered as in the old file, whose git blob id is `blob`."""

    path: str
    functions: frozenset[str]
    regions: tuple[Region, ...] | None = None
    blob: str | None = None


@dataclass(frozen=True, kw_only=True)
class Pick:
    """One entry of a suite: whether the diff can reach it, and why (or why not)."""

    entry: str
    runs: bool
    reason: str


def changes(files: Iterable[FileDiff], read_old: Callable[[str], str | None],
            read_new: Callable[[str], str | None]) -> tuple[Change, ...]:
    """Each changed file's functions: removed lines in the old source, added lines in the new.
    A file that is not Python, new, deleted, renamed or unparsable counts as a whole."""
    out: dict[str, set[str]] = {}
    found_regions: dict[str, tuple[Region, ...]] = {}
    blobs: dict[str, str] = {}
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
            got = regions(old_src, new_src, f.old_lines, f.new_lines, f.insert_after)
            if got is not None and path not in found_regions:
                found_regions[path] = got
                blobs[path] = blob_id(old_src.encode("utf-8"))
        out.setdefault(path, set()).update(found)
    return tuple(Change(path=p, functions=frozenset(fns), regions=found_regions.get(p), blob=blobs.get(p))
                 for p, fns in sorted(out.items()))


def whole_files(paths: Iterable[str]) -> tuple[Change, ...]:
    """Changed paths without their hunks (`plan --paths`): each counts as a whole."""
    return tuple(Change(path=p, functions=WHOLE_FILE) for p in sorted(set(paths)))


def leak(path: str, policy: SelectionPolicy) -> bool:
    """Whether a changed path changes behaviour without being executed as code."""
    if any(fnmatch.fnmatchcase(path, g) for g in policy.leak_paths):
        return True
    p = PurePosixPath(path)
    return p.suffix != ".py" and any(p.is_relative_to(d) for d in policy.non_python_leaks_under)


def _hits(change: Change, record: Record, line_map: LineMap | None) -> tuple[list[str], list[str]]:
    """What of the change the entry ran, and what it ran only around: the functions that
    hold changed lines, narrowed to the changed blocks where the record has their lines."""
    ran = record.files.get(change.path)
    if ran is None:
        return [], []
    if MODULE in change.functions:
        by_function = [f"{change.path} (module level changed)"]
    else:
        by_function = [f"{change.path}:{fn}" for fn in sorted(change.functions & set(ran))]
    lines = _recorded_lines(change, record, line_map)
    if not by_function or lines is None or change.regions is None:
        return by_function, []
    executed_lines, mapping = lines
    assert change.regions is not None
    hit = list(dict.fromkeys(f"{change.path} (module level changed)" if r.scope == MODULE
                             else f"{change.path}:{r.label()}"
                             for r in change.regions if entered(r, executed_lines, mapping)))
    return hit, ([] if hit else by_function)


def _recorded_lines(change: Change, record: Record,
                    line_map: LineMap | None) -> tuple[frozenset[int], Mapping[int, int] | None] | None:
    """The entry's executed lines of the changed file and the map onto them from the diff's
    old file (None: the same file); None when the record cannot say (no lines kept, another
    version of the file that cannot be mapped)."""
    spans, recorded = record.lines.get(change.path), record.blobs.get(change.path)
    if spans is None or recorded is None or change.blob is None:
        return None
    try:
        executed_lines = parse_spans(spans)
    except ValueError:
        return None
    if recorded == change.blob:
        return executed_lines, None
    mapping = line_map(change.path, change.blob, recorded) if line_map is not None else None
    return None if mapping is None else (executed_lines, mapping)


def pick(entries: Sequence[tuple[str, str]], diff: Sequence[Change],
         records: Mapping[str, Record], policy: SelectionPolicy, *,
         line_map: LineMap | None = None) -> tuple[Pick, ...]:
    """Each entry (id, its file) with whether the diff can reach it and the reason.

    `line_map` carries a changed file's old lines onto another recorded version of it (a
    record of an earlier or later commit; `ci.select.blocks.git_line_map`); without it such
    a record is read by its functions alone."""
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
            found = [_hits(c, record, line_map) for c in diff]
            hits = [h for got, _ in found for h in got]
            around = [h for _, near in found for h in near]
            if hits:
                out.append(Pick(entry=entry, runs=True, reason="executes " + _listed(hits)))
            elif around:
                out.append(Pick(entry=entry, runs=False,
                                reason=f"executes {_listed(around)} but none of the changed blocks"))
            else:
                out.append(Pick(entry=entry, runs=False, reason="executes none of the changed code"))
    return tuple(out)


def _listed(items: Sequence[str]) -> str:
    more = f" and {len(items) - SHOWN_REASONS} more" if len(items) > SHOWN_REASONS else ""
    return ", ".join(items[:SHOWN_REASONS]) + more
