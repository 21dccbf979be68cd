"""The AST reader: NUM_GPUS in every spelling, the test-file rule, what `__main__` runs."""

import sys
import textwrap

import pytest

from ci.discover import discover, is_test_file, read_source

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


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
