"""The AST reader: NUM_GPUS in every spelling, the test-file rule, what `__main__` runs."""

import sys
import textwrap
from pathlib import PurePosixPath

import pytest

from ci.select import discover as discover_module
from ci.select.discover import MAX_SOURCE_BYTES, discover, is_test_file, read_source, read_test_file

NUM_GPUS = 0


def _read(src: str):
    return read_source("tests/test_x.py", textwrap.dedent(src))


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        ("NUM_GPUS = 0\n", 0),
        ("NUM_GPUS: int = 0\n", 0),  # the original's regex turned this into 8 GPUs
        ("NUM_GPUS = 8\n", 8),
        ("import os\nNUM_GPUS: int = 4  # four\n", 4),
        ("NUM_GPUS = 2\nNUM_GPUS = 6\n", 6),  # the last binding wins, as at import
    ],
)
def test_num_gpus_spellings(src, expected):
    tf = _read(src)
    assert tf.num_gpus == expected
    assert tf.num_gpus_problem is None


@pytest.mark.parametrize(
    ("src", "problem"),
    [
        ("x = 1\n", "no module-level"),
        ("NUM_GPUS = int('8')\n", "integer literal"),
        ("NUM_GPUS = True\n", "integer literal"),
        ("NUM_GPUS = -1\n", "integer literal"),
        ("def f():\n    NUM_GPUS = 0\n", "no module-level"),
        ("NUM_GPUS: int\n", "no module-level"),
    ],
)
def test_unreadable_num_gpus_is_reported(src, problem):
    tf = _read(src)
    assert tf.num_gpus is None
    assert problem in (tf.num_gpus_problem or "")


def test_line_of_declaration_is_kept():
    tf = _read("import os\n\n\nNUM_GPUS = 'eight'\n")
    assert tf.num_gpus_line == 4


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("tests/test_a.py", True),
        ("tests/utils/test_b.py", True),
        ("tests/a/b/c/test_deep.py", True),
        ("tests/test_agent/_fakes.py", False),  # the original ran this helper as an 8-GPU test
        ("tests/conftest.py", False),
        ("tests/__init__.py", False),
        ("tests/helper_test.py", False),
        ("test_top.py", False),
        ("slime/tests/test_x.py", False),
        ("tests/test_data.json", False),
    ],
)
def test_the_one_test_file_rule(path, expected):
    assert is_test_file(path) is expected


def test_main_block_detection():
    runs = _read("""
        import pytest, sys
        NUM_GPUS = 0
        def test_a(): pass
        if __name__ == "__main__":
            sys.exit(pytest.main([__file__]))
    """)
    assert runs.has_main and runs.main_runs_something and runs.test_functions == 1
    idle = _read("""
        NUM_GPUS = 0
        def test_a(): pass
        if __name__ == "__main__":
            print("hello")
    """)
    assert idle.has_main and not idle.main_runs_something
    reversed_guard = _read("""
        NUM_GPUS = 8
        def execute(): pass
        if "__main__" == __name__:
            execute()
    """)
    assert reversed_guard.main_runs_something
    assert reversed_guard.kind == "script"


def test_counts_methods_of_test_classes_only():
    tf = _read("""
        NUM_GPUS = 0
        class TestThing:
            def test_a(self): pass
            def helper(self): pass
        class Helper:
            def test_not_collected(self): pass
        async def test_async(): pass
    """)
    assert tf.test_functions == 2
    assert tf.kind == "pytest"


def test_syntax_error_is_a_finding_not_a_crash():
    tf = _read("NUM_GPUS = 0\ndef test_(:\n")
    assert tf.syntax_error is not None and "line 2" in tf.syntax_error


def test_discover_walks_every_directory(tmp_path):
    for rel in ["tests/test_a.py", "tests/utils/test_b.py", "tests/x/y/test_c.py",
                "tests/test_agent/_fakes.py", "tests/conftest.py", "tests/.hidden/test_d.py"]:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("NUM_GPUS = 0\n")
    assert list(discover(tmp_path)) == ["tests/test_a.py", "tests/utils/test_b.py",
                                        "tests/x/y/test_c.py"]



def test_kind_is_script_only_for_a_test_less_file_whose_main_runs_something():
    script = _read("NUM_GPUS = 8\ndef execute(): pass\nif __name__ == '__main__':\n    execute()\n")
    assert (script.kind, script.test_functions, script.main_line) == ("script", 0, 3)
    both = _read("NUM_GPUS = 0\ndef test_a(): pass\nif __name__ == '__main__':\n    test_a()\n")
    assert both.kind == "pytest"
    nothing = _read("NUM_GPUS = 0\n")
    assert nothing.kind == "pytest" and not nothing.has_main and nothing.main_line is None


@pytest.mark.parametrize(("main", "runs"), [
    ("import unittest\nif __name__ == '__main__':\n    unittest.main()\n", True),
    ("import pytest\nif __name__ == '__main__':\n    raise SystemExit(pytest.main([__file__]))\n", True),
    # Calls that look alike but run nothing of the file.
    ("import os\nif __name__ == '__main__':\n    os.main()\n", False),
    ("import pytest\nif __name__ == '__main__':\n    pytest.skip()\n", False),
    ("import pytest\nif __name__ == '__main__':\n    pytest.main.x()\n", False),
    ("import pytest\nif __name__ == '__main__':\n    main()\n", False),  # no such function here
    ("def main(): pass\nif __name__ == '__main__':\n    main()\n", True),
    ("class main: pass\nif __name__ == '__main__':\n    main()\n", False),  # a class is no function
    ("async def main(): pass\nif __name__ == '__main__':\n    main()\n", True),
])
def test_what_counts_as_running_the_file(main, runs):
    tf = read_source("tests/test_x.py", "NUM_GPUS = 0\n" + main)
    assert tf.has_main and tf.main_runs_something is runs


@pytest.mark.parametrize("guard", [
    "if __name__ != '__main__':",
    "if __name__ == 'main':",
    "if __file__ == '__main__':",
    "if __name__:",
    "if __name__ == '__main__' == __name__:",
    "if __name__ == '__main__' and x:",
])
def test_only_the_main_guard_is_a_main_block(guard):
    tf = read_source("tests/test_x.py", f"NUM_GPUS = 0\ndef run(): pass\n{guard}\n    run()\n")
    assert not tf.has_main and not tf.main_runs_something


def test_the_last_main_block_is_the_one_that_counts():
    tf = _read("""
        NUM_GPUS = 0
        def run(): pass
        if __name__ == "__main__":
            run()
        if __name__ == "__main__":
            print("done")
    """)
    assert tf.has_main and not tf.main_runs_something and tf.main_line == 6


def test_num_gpus_in_a_tuple_or_chained_assignment_is_no_declaration():
    for src in ("NUM_GPUS, X = 0, 1\n", "NUM_GPUS = X = 0\n", "self.NUM_GPUS = 0\n",
                "NUM_GPUS += 1\n"):
        tf = read_source("tests/test_x.py", src)
        assert tf.num_gpus is None and tf.num_gpus_line is None, src
        assert tf.num_gpus_problem == ("no module-level `NUM_GPUS = <int>`; declare how many GPUs "
                                       "the file needs"), src


def test_a_bad_declaration_after_a_good_one_is_what_counts():
    tf = _read("NUM_GPUS = 2\nNUM_GPUS = 2.0\n")
    assert (tf.num_gpus, tf.num_gpus_line) == (None, 2)
    assert tf.num_gpus_problem == "`NUM_GPUS` must be a non-negative integer literal, got `2.0`"
    # A good one after a bad one clears the problem.
    tf = _read("NUM_GPUS = 'x'\nNUM_GPUS: int = 3\n")
    assert (tf.num_gpus, tf.num_gpus_line, tf.num_gpus_problem) == (3, 2, None)


def test_a_long_expression_is_shown_cut_to_sixty_characters():
    start = "`NUM_GPUS` must be a non-negative integer literal, got `"
    for shown, expected in (("x" * 59, "x" * 59), ("x" * 60, "x" * 60), ("x" * 61, "x" * 59 + "…"),
                            ("y" * 200, "y" * 59 + "…")):
        assert _read(f"NUM_GPUS = {shown}\n").num_gpus_problem == f"{start}{expected}`"


def test_an_expression_too_deep_to_show_is_named_not_raised():
    # The parser builds this tree, but writing it back out overflows the stack.
    deep = "-" * 2000 + "1"
    tf = read_source("tests/test_x.py", f"NUM_GPUS = {deep}\n")
    assert tf.syntax_error is None and tf.num_gpus_line == 1
    assert tf.num_gpus_problem == ("`NUM_GPUS` must be a non-negative integer literal, got "
                                   "`a deeply nested expression`")


def test_files_nested_too_deeply_for_the_parser_are_findings():
    tf = read_source("tests/test_x.py", "NUM_GPUS = 0\nx = " + "-" * 100000 + "1\n")
    assert tf.syntax_error == "line 1: nested too deeply for Python's parser"
    assert tf.num_gpus is None and tf.num_gpus_problem == "the file does not parse"
    assert (tf.test_functions, tf.has_main, tf.main_runs_something, tf.main_line) == (0, False, False, None)
    assert tf.kind == "pytest"


def _unreadable(path, num_gpus_problem, syntax_error):
    return discover_module.TestFile(path=path, num_gpus=None, num_gpus_line=None, num_gpus_problem=num_gpus_problem,
                    test_functions=0, has_main=False, main_runs_something=False, main_line=None,
                    syntax_error=syntax_error)


def test_read_test_file_reports_what_it_cannot_read(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_latin1.py").write_bytes(b"NUM_GPUS = 0\ndef test_a(): pass\n# caf\xe9\n")
    assert read_test_file(tmp_path, "tests/test_latin1.py") == _unreadable(
        "tests/test_latin1.py", "the file is not UTF-8",
        "'utf-8' codec can't decode byte 0xe9 in position 37: invalid continuation byte")
    assert read_test_file(tmp_path, "tests/test_gone.py") == _unreadable(
        "tests/test_gone.py", "the file does not parse", "cannot read it (No such file or directory)")
    (tests / "test_dir.py").mkdir()
    assert read_test_file(tmp_path, "tests/test_dir.py") == _unreadable(
        "tests/test_dir.py", "the file does not parse", "cannot read it (Is a directory)")


def test_an_endless_file_is_read_only_up_to_the_limit(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_zero.py").symlink_to("/dev/zero")
    assert read_test_file(tmp_path, "tests/test_zero.py") == _unreadable(
        "tests/test_zero.py", "the file does not parse", "larger than 4 MiB; no test file is that big")


def test_a_file_over_the_size_limit_is_not_parsed(tmp_path, monkeypatch):
    tests = tmp_path / "tests"
    tests.mkdir()
    body = b"NUM_GPUS = 0\n" + b"#" * (MAX_SOURCE_BYTES - 13)
    assert len(body) == MAX_SOURCE_BYTES
    (tests / "test_at_limit.py").write_bytes(body)
    assert read_test_file(tmp_path, "tests/test_at_limit.py").num_gpus == 0
    (tests / "test_over.py").write_bytes(body + b"\n")
    over = read_test_file(tmp_path, "tests/test_over.py")
    assert over.syntax_error == "larger than 4 MiB; no test file is that big"
    assert over.num_gpus is None


def test_a_syntax_error_names_its_line_and_the_parsers_words():
    tf = read_source("tests/test_x.py", "NUM_GPUS = 0\n\n\nx = (\n")
    assert tf == _unreadable("tests/test_x.py", "the file does not parse", "line 4: '(' was never closed")


def test_functions_and_classes_add_up_in_any_order():
    tf = _read("""
        NUM_GPUS = 0
        def test_first(): pass
        def test_second(): pass
        class TestLater:
            def test_a(self): pass
        class TestEmpty:
            pass
    """)
    assert tf.test_functions == 3


def test_discover_without_a_tests_directory_finds_nothing(tmp_path):
    assert discover(tmp_path) == {}
    (tmp_path / "tests").write_text("not a directory")
    assert discover(tmp_path) == {}


def test_discover_describes_each_file_and_skips_caches_and_non_files(tmp_path):
    tests = tmp_path / "tests"
    (tests / "__pycache__").mkdir(parents=True)
    (tests / "__pycache__" / "test_cached.py").write_text("NUM_GPUS = 0\n")
    (tests / "sub").mkdir()
    (tests / "sub" / "test_two.py").write_text("NUM_GPUS = 2\ndef test_a(): pass\n")
    (tests / "test_one.py").write_text("NUM_GPUS: int = 1\n")
    (tests / "test_folder.py").mkdir()  # a directory named like a test file
    (tests / "test_notes.pyc").write_text("")
    found = discover(tmp_path)
    assert list(found) == ["tests/sub/test_two.py", "tests/test_one.py"]
    assert found["tests/sub/test_two.py"].path == "tests/sub/test_two.py"
    assert (found["tests/sub/test_two.py"].num_gpus, found["tests/sub/test_two.py"].test_functions) == (2, 1)
    assert found["tests/test_one.py"].num_gpus == 1


def test_the_test_file_rule_reads_posix_paths():
    assert is_test_file(PurePosixPath("tests/test_a.py"))
    assert not is_test_file("tests")
    assert not is_test_file("tests/test_a.pyx")
    assert not is_test_file("tests/test_a.py/x")
    assert not is_test_file("tests/Test_a.py")
    assert is_test_file("tests/test_.py")

if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
