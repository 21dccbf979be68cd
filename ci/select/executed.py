"""What an entry executed: lines reduced to the functions that hold them, and their store.

A record names, for each repository file an entry ran, the functions whose bodies ran
(`Cls.method`, `outer.inner`), plus `<module>` for lines at module level (run on import)
and the class name for lines of a class body (also run on import); and the lines that ran,
as spans (`"1-5,9"`), with the file's git blob id at the recorded commit, so selection can
tell which branch of a function ran and map those lines onto a later version of the file
(`ci.select.blocks`). The run observer
`ci.run.record_executed` writes records; selection (`ci.select.by_execution`) reads the
newest one per entry. The store is one JSON file under `.ci-cache/`: a checkout's last
trusted recording run, per entry, with the commit it ran.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ci.errors import UsageError

MODULE = "<module>"  # module-level code: a change there counts as the whole file
RECORDS_FILE = Path(".ci-cache") / "executed" / "records.json"
FORMAT = 2  # 1: functions only; still read (selection falls back to functions)
READ_FORMATS = (1, 2)


@dataclass(frozen=True, kw_only=True)
class Scope:
    """One def or class of a file: its qualified name and its lines."""

    name: str
    start: int  # the first decorator's line, else the def/class line
    body: int  # the first line of its body: lines before it run when the enclosing scope runs
    end: int
    is_class: bool


def scopes(source: str) -> tuple[Scope, ...]:
    """Every def and class of a file, outermost first; () when it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    found: list[Scope] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                found.append(Scope(name=name, start=start, body=child.body[0].lineno,
                                   end=child.end_lineno or child.lineno,
                                   is_class=isinstance(child, ast.ClassDef)))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return tuple(found)


def _innermost(found: Iterable[Scope], line: int, *, headers: bool) -> str:
    best: Scope | None = None
    for s in found:
        first = s.start if headers else s.body
        if first <= line <= s.end and (best is None or s.start >= best.start):
            best = s
    return MODULE if best is None else best.name


def executed_functions(found: tuple[Scope, ...], lines: Iterable[int]) -> set[str]:
    """The scopes whose bodies hold executed lines. A `def` line runs when the enclosing
    scope runs (import, for a top-level def), so it counts for that scope, not the function."""
    return {_innermost(found, n, headers=False) for n in lines}


def changed_functions(found: tuple[Scope, ...], lines: Iterable[int]) -> set[str]:
    """The scopes that changed lines fall in, a signature or decorator counting for its function."""
    return {_innermost(found, n, headers=True) for n in lines}


@dataclass(frozen=True, kw_only=True)
class Record:
    """What one entry executed at one commit."""

    entry: str
    commit: str
    recorded_at: float
    files: Mapping[str, tuple[str, ...]]  # repository path -> functions executed, sorted
    # repository path -> the lines that ran, as spans; {} for a record made before lines were
    # kept (format 1): selection then goes by functions alone
    lines: Mapping[str, str] = field(default_factory=dict)
    # repository path -> the file's git blob id as it ran (`git hash-object`): which version
    # of the file `lines` number
    blobs: Mapping[str, str] = field(default_factory=dict)


def spans(lines: Iterable[int]) -> str:
    """Line numbers as sorted spans: [1, 2, 3, 5] -> "1-3,5" (pure)."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted(set(lines)):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [n]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def parse_spans(text: str) -> frozenset[int]:
    """`spans` read back; ValueError on anything else."""
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        lo, hi = int(first), int(last or first)
        if lo < 1 or hi < lo:
            raise ValueError(f"not a span of line numbers: {part!r}")
        out.update(range(lo, hi + 1))
    return frozenset(out)


def blob_id(data: bytes) -> str:
    """The git blob id of a file's bytes, as `git hash-object` gives it (pure)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True, kw_only=True)
class Reduced:
    """What `reduce` keeps of one entry's measured lines, by repository path."""

    files: dict[str, tuple[str, ...]]
    lines: dict[str, str]
    blobs: dict[str, str]


def reduce(root: Path, measured: Mapping[str, Iterable[int]]) -> Reduced:
    """Executed lines by absolute file -> executed functions, line spans and blob ids by
    repository path, for files of `root` only (a site-packages file or a scratch copy
    elsewhere is not the repository's)."""
    out: dict[str, tuple[str, ...]] = {}
    ran: dict[str, str] = {}
    blobs: dict[str, str] = {}
    base = root.resolve()
    for name, measured_lines in measured.items():
        path = Path(name).resolve()
        if not path.is_relative_to(base) or path.suffix != ".py":
            continue
        rel = path.relative_to(base).as_posix()
        if rel.startswith((".nox/", ".venv/", ".ci-cache/")):
            continue
        try:
            data = path.read_bytes()
            source = data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        lines = tuple(measured_lines)
        executed = executed_functions(scopes(source), lines)
        if executed:
            out[rel] = tuple(sorted(executed))
            ran[rel] = spans(lines)
            blobs[rel] = blob_id(data)
    return Reduced(files=dict(sorted(out.items())), lines=dict(sorted(ran.items())),
                   blobs=dict(sorted(blobs.items())))


def load(path: Path) -> dict[str, Record]:
    """The newest record per entry id; {} when there is no store yet."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a records file ({exc.__class__.__name__}); delete it and "
                         "record again with `python -m ci run --record-executed`") from None
    if not isinstance(raw, dict) or raw.get("format") not in READ_FORMATS:
        raise UsageError(f"{path}: unknown records format; delete it and record again "
                         "with `python -m ci run --record-executed`")
    return {entry: Record(entry=entry, commit=str(r["commit"]), recorded_at=float(r["recorded_at"]),
                          files={f: tuple(fns) for f, fns in r["files"].items()},
                          lines=dict(r.get("lines", {})), blobs=dict(r.get("blobs", {})))
            for entry, r in raw["entries"].items()}


def save(path: Path, records: Iterable[Record]) -> None:
    """Merge `records` into the store (newest per entry wins), written atomically. The
    smoke's runs end at once, each saving its own suite's: a lock keeps every one's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".records.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _merge(path, records)


def _merge(path: Path, records: Iterable[Record]) -> None:
    kept = load(path)
    for r in records:
        kept[r.entry] = r
    body = {"format": FORMAT, "entries": {
        e: {"commit": r.commit, "recorded_at": r.recorded_at,
            "files": {f: list(fns) for f, fns in r.files.items()},
            "lines": dict(r.lines), "blobs": dict(r.blobs)}
        for e, r in sorted(kept.items())}}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".records-")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(body, out, indent=1, sort_keys=True)
    os.replace(tmp, path)
