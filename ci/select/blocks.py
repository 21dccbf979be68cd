"""Below functions: the block of statements a change falls in, and whether an entry entered it.

A function-level rule runs every entry that called a function when one branch of it
changed. A block is one list of statements (a function's body, an `if` branch, a loop's
body, an `except` handler, the module's top level); its code runs only when control
enters it, and control never enters it without running its first statement. So an entry
whose recorded lines (`ci.select.executed`: every line coverage saw run) include none of
a block's lines never ran any of it, and a change inside that block cannot reach it.

A change is mapped to the innermost block holding it, on the side it is on: a removed or
replaced line in the old file, an added line in the new one (then the block's unchanged
lines, numbered as in the old file). A def's or class's own header (decorators, signature,
bases) counts for its body, as the function rule counts it for the function. A block of
added lines only counts as its enclosing block; a wholly new def or class reaches nothing
(as the function rule: no entry ran it). Lines that hold no code (blank lines, comments)
change nothing. What a changed line falls between (an `else:`, an `except` clause) counts
for the block around it.

The records were made at some commit, the diff is against another: `line_map` carries
line numbers from the diff's old file to the recorded version of it (its blob), through
`git diff` of the two blobs. Pure, but for `git_line_map`, which reads git.
"""

from __future__ import annotations

import ast
import functools
import io
import subprocess
import tokenize
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ci.select.executed import MODULE
from ci.select.unified_diff import parse_diff

LineMap = Callable[[str, str, str], "Mapping[int, int] | None"]  # (path, old blob, recorded blob)
_NO_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER, tokenize.ENCODING}
_HEADER_LINES = 2  # a comment in the first two lines may be an encoding declaration: code


@dataclass(frozen=True, kw_only=True)
class Block:
    """One list of statements: its lines (a def's header with its body), and the def/class
    whose code it is (`<module>` at top level)."""

    scope: str
    start: int  # a def's or class's body: where the def or class starts (its header counts)
    body: int  # the first line of its first statement
    end: int
    is_def: bool = False  # the body of a def or class
    owner: int | None = None  # the line of the statement it belongs to (`if`, `def`); None: top level
    slot: str = "body"  # which of that statement's blocks: body, orelse, finalbody, handler1, case2

    def body_lines(self) -> range:
        """Its statements' lines: a header runs when the enclosing block runs (a `def` line
        on import), so it is no sign that this block ran."""
        return range(self.body, self.end + 1)


@dataclass(frozen=True, kw_only=True)
class Region:
    """Where one change falls: the lines of code of its block, numbered as in the old file.
    An entry that ran none of them never entered the block. Empty `lines`: a wholly new def
    or class."""

    scope: str
    lines: frozenset[int]

    def label(self) -> str:
        if not self.lines:
            return f"{self.scope} (new)"
        return f"{self.scope} lines {min(self.lines)}-{max(self.lines)}"


def blocks(source: str) -> tuple[Block, ...] | None:
    """Every block of a file, outermost first; None when it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    found: list[Block] = []

    def add(body: list[ast.stmt], scope: str, node: ast.AST, slot: str, *, is_def: bool = False) -> None:
        if not body:
            return
        first = _first_line(body[0])
        owner = getattr(node, "lineno", None)
        found.append(Block(scope=scope, start=_first_line(node) if is_def else first, body=first,
                           end=body[-1].end_lineno or body[-1].lineno, is_def=is_def, owner=owner, slot=slot))
        for s in body:
            visit(s, scope)

    def visit(node: ast.AST, scope: str) -> None:
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if not (isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt)):
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and field == "body":
                add(stmts, node.name if scope == MODULE else f"{scope}.{node.name}", node, field, is_def=True)
            else:
                add(stmts, scope, node, field)
        for i, handler in enumerate(getattr(node, "handlers", ())):
            add(handler.body, scope, node, f"handler{i}")
        for i, case in enumerate(getattr(node, "cases", ())):
            add(case.body, scope, node, f"case{i}")

    visit(tree, MODULE)
    return tuple(found)


def _first_line(node: ast.AST) -> int:
    decorators: list[ast.expr] = getattr(node, "decorator_list", [])
    return min([int(getattr(node, "lineno", 1)), *(d.lineno for d in decorators)])


def innermost(found: Iterable[Block], line: int) -> Block | None:
    """The smallest block holding `line` (blocks nest, so the smallest is the innermost)."""
    return _smallest(b for b in found if b.start <= line <= b.end)


def _smallest(holding: Iterable[Block]) -> Block | None:
    """The innermost of nested blocks. Two can span the same lines (a branch whose only
    statement is a decorated def, its header counted for its body): `blocks` lists the
    outer first, so the last of the smallest is the inner."""
    best: Block | None = None
    for b in holding:
        if best is None or b.end - b.start <= best.end - best.start:
            best = b
    return best


def code_lines(source: str) -> frozenset[int] | None:
    """The lines that hold code (a token other than a comment or layout); None when the
    file does not tokenize. A string spanning lines holds code on each of them."""
    out: set[int] = set(range(1, _HEADER_LINES + 1))
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type not in _NO_CODE:
                out.update(range(tok.start[0], tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        return None
    return frozenset(out)


def unchanged_pairs(old_changed: Iterable[int], new_changed: Iterable[int], old_count: int,
                    new_count: int) -> dict[int, int]:
    """New line -> old line for the lines a diff left alone: the k-th unchanged line of one
    side is the k-th of the other (pure)."""
    gone, added = set(old_changed), set(new_changed)
    olds = [n for n in range(1, old_count + 1) if n not in gone]
    news = [n for n in range(1, new_count + 1) if n not in added]
    return dict(zip(news, olds, strict=False))


def regions(old_src: str, new_src: str | None, old_changed: Iterable[int], new_added: Iterable[int],
            insert_after: Iterable[int]) -> tuple[Region, ...] | None:
    """The regions of one file's change; None when a side does not parse or tokenize (the
    caller then goes by functions). Without the new side (a plant's patch), an insertion
    counts for the innermost block that holds the lines on both sides of it."""
    old_blocks, old_code = blocks(old_src), code_lines(old_src)
    if old_blocks is None or old_code is None:
        return None
    out: set[Region] = set()
    for line in old_changed:
        if line in old_code:
            out.add(_region(innermost(old_blocks, line), old_code))
    if new_src is None:
        for a in insert_after:
            out.add(_region(_smallest(b for b in old_blocks if b.start <= a and a + 1 <= b.end), old_code))
        return tuple(sorted(out, key=lambda r: (r.scope, sorted(r.lines))))
    new_blocks, new_code = blocks(new_src), code_lines(new_src)
    if new_blocks is None or new_code is None:
        return None
    added = [n for n in new_added if n in new_code]
    to_old = unchanged_pairs(old_changed, new_added, len(old_src.splitlines()), len(new_src.splitlines()))
    for line in added:
        out.add(_new_region(new_blocks, old_blocks, line, to_old, new_code, old_code))
    return tuple(sorted(out, key=lambda r: (r.scope, sorted(r.lines))))


def _region(block: Block | None, code: frozenset[int]) -> Region:
    """A block of the old file as a region: its lines of code (none given: the whole file's)."""
    if block is None:  # between top-level statements: the file's top level
        return Region(scope=MODULE, lines=code)
    return Region(scope=block.scope, lines=frozenset(n for n in block.body_lines() if n in code))


def _new_region(found: tuple[Block, ...], old_blocks: tuple[Block, ...], line: int,
                to_old: Mapping[int, int], code: frozenset[int], old_code: frozenset[int]) -> Region:
    """An added line's region: its block's unchanged lines of code, numbered as in the old
    file (an old comment inside a new block says nothing of whether it ran). A
    block of added lines only is the same block of the old file when the statement it belongs
    to is unchanged (the branch of an `if` whose body was rewritten: control enters both
    alike); else it gives way to the block around it, but a new def or class, which no
    entry can have run, is empty."""
    block = innermost(found, line)
    while block is not None:
        kept = frozenset(to_old[n] for n in block.body_lines() if n in to_old and n in code)
        if kept:
            return Region(scope=block.scope, lines=kept)
        if block.owner is not None and block.owner in to_old:
            same = [b for b in old_blocks if b.owner == to_old[block.owner] and b.slot == block.slot]
            if same:
                return _region(same[0], old_code)
        if block.is_def:
            return Region(scope=block.scope, lines=frozenset())
        block = _smallest(b for b in found if b.start <= block.start and block.end <= b.end and b != block)
    return _region(None, old_code)


def entered(region: Region, executed: frozenset[int], line_map: Mapping[int, int] | None) -> bool:
    """Whether an entry that ran `executed` (numbered as its recorded file) entered the
    region's block. `line_map`: old-file line -> recorded line, None when they are the same
    file. A region none of whose lines is in the recorded file (all changed since) counts as
    entered: the record cannot tell."""
    if not region.lines:
        return False
    if line_map is None:
        return not executed.isdisjoint(region.lines)
    mapped = {line_map[n] for n in region.lines if n in line_map}
    return not mapped or not executed.isdisjoint(mapped)


@functools.lru_cache(maxsize=4)
def git_line_map(root: Path) -> LineMap:
    """Old-file lines -> recorded lines through `git diff` of the two blobs, once per pair
    for the process (blobs never change; every plant and job of an audit or plan shares
    it); None where either blob is not in the checkout (a shallow clone): selection then
    goes by functions for that file, and a later call asks git again."""
    cache: dict[tuple[str, str], Mapping[int, int]] = {}

    def count(blob: str) -> int | None:
        shown = _git(root, "cat-file", "-p", blob)
        return None if shown is None else len(shown.splitlines())

    def line_map(path: str, old_blob: str, recorded_blob: str) -> Mapping[int, int] | None:
        key = (old_blob, recorded_blob)
        if key not in cache:
            found = _map(old_blob, recorded_blob)
            if found is None:
                return None
            cache[key] = found
        return cache[key]

    def _map(old_blob: str, recorded_blob: str) -> Mapping[int, int] | None:
        text = _git(root, "diff", "-U0", "--no-color", "--no-ext-diff", old_blob, recorded_blob)
        old_count, new_count = count(old_blob), count(recorded_blob)
        if text is None or old_count is None or new_count is None:
            return None
        files = parse_diff(text)
        gone = files[0].old_lines if files else frozenset()
        added = files[0].new_lines if files else frozenset()
        return {o: n for n, o in unchanged_pairs(gone, added, old_count, new_count).items()}

    return line_map


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                             timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None
