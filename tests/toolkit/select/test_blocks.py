"""Selection below functions: a change's block, and whether an entry's recorded lines entered it.

Records are written by hand here to pin each rule; the lines a real emulated run records
are in tests/toolkit/run/test_record_executed.py.
"""

import subprocess
import sys
import textwrap

import pytest

from ci.registry.model import SelectionPolicy
from ci.select.blocks import blocks, code_lines, entered, git_line_map, innermost, regions
from ci.select.by_execution import changes, pick
from ci.select.executed import MODULE, Record, blob_id, spans
from ci.select.unified_diff import parse_diff

NUM_GPUS = 0

SOURCE = textwrap.dedent('''\
    import os
    LIMIT = 3


    @decorated
    def load(path, fast=False):
        """Read a file."""
        if fast:
            data = os.read(path)
        else:
            data = open(path).read()
        # the data as it is
        return data


    class Saver:
        kind = "disk"

        def save(self, data):
            try:
                write(data)
            except OSError:
                return False
            return True
''')
# line numbers of SOURCE
IMPORT, DECORATOR, DEF_LOAD, IF_FAST, FAST_READ, ELSE, SLOW_READ, COMMENT, RETURN = 1, 5, 6, 8, 9, 10, 11, 12, 13
KIND, DEF_SAVE, TRY, WRITE, EXCEPT, RET_FALSE, RET_TRUE = 17, 19, 20, 21, 22, 23, 24
IMPORTED = {IMPORT, 2, DECORATOR, DEF_LOAD, 16, KIND, DEF_SAVE}  # what an import runs
FAST_CALL = IMPORTED | {IF_FAST, FAST_READ, RETURN}  # load(p, fast=True)
SLOW_CALL = IMPORTED | {IF_FAST, SLOW_READ, RETURN}  # load(p)


def replaced(line: int, text: str) -> str:
    lines = SOURCE.splitlines(keepends=True)
    lines[line - 1] = text + "\n"
    return "".join(lines)


def inserted(after: int, text: str) -> str:
    lines = SOURCE.splitlines(keepends=True)
    lines.insert(after, text + "\n")
    return "".join(lines)


def change_regions(new: str):
    old_lines, new_lines = SOURCE.splitlines(), new.splitlines()
    import difflib

    gone: set[int] = set()
    added: set[int] = set()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False).get_opcodes():
        if tag != "equal":
            gone.update(range(i1 + 1, i2 + 1))
            added.update(range(j1 + 1, j2 + 1))
    return regions(SOURCE, new, gone, added, ())


def reaches(new: str, ran: set[int]) -> bool:
    return any(entered(r, frozenset(ran), None) for r in change_regions(new))


def test_the_blocks_of_a_file_nest_and_a_header_counts_for_its_body():
    found = blocks(SOURCE)
    assert innermost(found, FAST_READ).scope == "load" and innermost(found, FAST_READ).body == FAST_READ
    assert innermost(found, DECORATOR).body == 7  # the decorator: load's body, from its docstring
    assert innermost(found, ELSE).body == 7  # `else:` is in the block around the if: load's body
    assert innermost(found, RET_FALSE).scope == "Saver.save"
    assert innermost(found, IMPORT).scope == MODULE
    assert code_lines(SOURCE) >= {IMPORT, FAST_READ, 7} and COMMENT not in code_lines(SOURCE)


def test_a_decorated_def_alone_in_a_branch_is_its_own_block():
    # The branch and the def's body (header included) span the same lines: the def is inner.
    src = "if FAST:\n    @cached\n    def read():\n        return 1\n"
    assert innermost(blocks(src), 4).scope == "read"
    defined_only = frozenset({1, 2, 3})  # the branch ran and defined read, nobody called it
    [region] = regions(src, src.replace("return 1", "return 2"), {4}, {4}, ())
    assert not entered(region, defined_only, None) and entered(region, defined_only | {4}, None)


def test_a_change_in_a_branch_reaches_only_the_entries_that_took_it():
    new = replaced(FAST_READ, "            data = os.read(path, 10)")
    assert reaches(new, FAST_CALL)
    assert not reaches(new, SLOW_CALL)  # called load, never took the fast branch
    assert not reaches(new, IMPORTED)


def test_a_change_at_the_function_level_reaches_every_caller():
    new = replaced(RETURN, "        return data.strip()")
    assert reaches(new, FAST_CALL) and reaches(new, SLOW_CALL) and not reaches(new, IMPORTED)
    signature = replaced(DEF_LOAD, "def load(path, fast=True):")
    assert reaches(signature, SLOW_CALL) and not reaches(signature, IMPORTED)


def test_a_line_between_blocks_counts_for_the_block_around_them():
    new = replaced(ELSE, "    elif path:")
    assert reaches(new, SLOW_CALL) and reaches(new, FAST_CALL) and not reaches(new, IMPORTED)


def test_module_and_class_bodies_reach_every_entry_that_imported_the_file():
    assert reaches(replaced(2, "LIMIT = 4"), IMPORTED)
    assert reaches(replaced(KIND, '    kind = "tape"'), IMPORTED)


def test_an_insertion_counts_for_the_block_it_lands_in_on_the_new_side():
    # After the fast read but at the function's level: every caller runs it.
    after_if = inserted(SLOW_READ, "    data = data or ''")
    assert reaches(after_if, FAST_CALL) and reaches(after_if, SLOW_CALL)
    inside = inserted(SLOW_READ, "        data = data or ''")
    assert reaches(inside, SLOW_CALL) and not reaches(inside, FAST_CALL)
    # A new `except` handler of its own lines only: the block around the try.
    handler = inserted(RET_FALSE, "        except ValueError:\n            return None")
    ran_save = IMPORTED | {TRY, WRITE, RET_TRUE}
    assert reaches(handler, ran_save) and not reaches(handler, IMPORTED)


def test_an_old_comment_inside_a_new_block_does_not_stand_for_the_block():
    # A new `else` around an old comment: the comment is the block's only old line, and no
    # entry ever "ran" a comment, so the region must be the block around the if.
    old = "if FAST:\n    a()\n# note\nb()\n"
    new = "if FAST:\n    a()\nelse:\n    c()\n# note\n    d()\nb()\n"
    got = regions(old, new, (), {3, 4, 6}, ())
    assert got and all(entered(r, frozenset({1, 4}), None) for r in got)  # ran the if, not its body


def test_a_comment_or_a_blank_line_changes_nothing_and_a_new_def_reaches_nothing():
    assert change_regions(replaced(COMMENT, "        # the data, unchanged")) == ()
    new_def = inserted(14, "\ndef unused():\n    return 1\n")
    assert not reaches(new_def, FAST_CALL | {15, 16})


def test_without_the_new_side_an_insertion_counts_for_the_block_holding_both_neighbours():
    got = regions(SOURCE, None, (), (), (FAST_READ,))  # a line after the fast read, new side unknown
    assert [r.scope for r in got] == ["load"] and IF_FAST in got[0].lines  # load's body: both sides


def record(ran: set[int], blob: str | None = None) -> Record:
    return Record(entry="e", commit="c", recorded_at=0.0, files={"pkg/io.py": ("load", MODULE)},
                  lines={"pkg/io.py": spans(ran)}, blobs={"pkg/io.py": blob or blob_id(SOURCE.encode())})


def picked(new: str, recs: dict, line_map=None):
    text = "".join(difflib_unified(SOURCE, new))
    diff = changes(parse_diff(text), lambda _: SOURCE, lambda _: new)
    return {p.entry: p for p in pick([(e, f"tests/{e}.py") for e in recs], diff, recs, SelectionPolicy(),
                                     line_map=line_map)}


def difflib_unified(old: str, new: str):
    import difflib

    yield "diff --git a/pkg/io.py b/pkg/io.py\n"
    yield from difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                    "a/pkg/io.py", "b/pkg/io.py", n=0)


def test_pick_narrows_a_function_to_its_changed_blocks_and_says_why():
    new = replaced(FAST_READ, "            data = os.read(path, 10)")
    recs = {"fast": record(FAST_CALL), "slow": record(SLOW_CALL),
            "old": Record(entry="old", commit="c", recorded_at=0.0, files={"pkg/io.py": ("load",)})}
    got = picked(new, recs)
    assert got["fast"].runs and got["fast"].reason == "executes pkg/io.py:load lines 9-9"
    assert not got["slow"].runs
    assert got["slow"].reason == "executes pkg/io.py:load but none of the changed blocks"
    assert got["old"].runs and got["old"].reason == "executes pkg/io.py:load"  # no lines: by function


def test_a_record_of_another_version_is_read_through_the_line_map_or_by_functions():
    new = replaced(FAST_READ, "            data = os.read(path, 10)")
    shifted = {n + 2 for n in FAST_CALL}  # recorded where two lines above came later
    recs = {"fast": record(shifted, blob="b" * 40), "slow": record({n + 2 for n in SLOW_CALL}, blob="b" * 40)}
    by_functions = picked(new, recs)
    assert by_functions["fast"].runs and by_functions["slow"].runs  # cannot map: no narrowing
    plus_two = picked(new, recs, line_map=lambda path, old, rec: {n: n + 2 for n in range(1, 40)})
    assert plus_two["fast"].runs and not plus_two["slow"].runs


def test_git_line_map_follows_the_lines_between_two_blobs(tmp_path):
    def git(*args, text_in=None):
        return subprocess.run(["git", "-C", str(tmp_path), *args], input=text_in, capture_output=True,
                              text=True, check=True).stdout.strip()

    git("init", "-q")
    later = "# a header line\n# and another\n" + SOURCE.replace("    kind = \"disk\"\n", "")
    old_blob = git("hash-object", "-w", "--stdin", text_in=SOURCE)
    new_blob = git("hash-object", "-w", "--stdin", text_in=later)
    assert old_blob == blob_id(SOURCE.encode())
    mapping = git_line_map(tmp_path)("pkg/io.py", old_blob, new_blob)
    assert mapping[FAST_READ] == FAST_READ + 2 and mapping[DEF_SAVE] == DEF_SAVE + 1
    assert KIND not in mapping  # removed in the later version
    assert git_line_map(tmp_path)("pkg/io.py", old_blob, "0" * 40) is None  # not in this checkout


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, *sys.argv[1:]]))
