"""Read test files without importing them: their `NUM_GPUS`, their kind, whether they run anything.

Everything here works on source text through `ast`, never by regex: the original
CI's regex read `NUM_GPUS: int = 0` as "no declaration" and ran the file on 8 GPUs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

TESTS_DIR = "tests"
NUM_GPUS = "NUM_GPUS"
# A test file is read whole into the parser; one far beyond any real test is a finding, not
# minutes of parsing and gigabytes of syntax tree for every command.
MAX_SOURCE_BYTES = 4 * 1024 * 1024

Kind = Literal["pytest", "script"]

# Calls inside `if __name__ == "__main__":` that count as running the file's tests.
_RUNNER_CALLS = {("pytest", "main"), ("unittest", "main")}


@dataclass(frozen=True, kw_only=True)
class TestFile:
    """What the AST says about one test file."""

    path: str  # POSIX path relative to the repository root
    num_gpus: int | None
    num_gpus_line: int | None  # line of the declaration; None when absent
    num_gpus_problem: str | None  # why NUM_GPUS could not be read, when it could not
    test_functions: int  # module-level `test_*` functions plus `test_*` methods of `Test*` classes
    has_main: bool  # an `if __name__ == "__main__":` block exists
    main_runs_something: bool  # that block calls pytest.main/unittest.main or a function of the file
    main_line: int | None
    syntax_error: str | None = None

    @property
    def kind(self) -> Kind:
        """pytest files are judged by their report; e2e scripts (prepare/execute) by exit code."""
        if self.test_functions == 0 and self.main_runs_something:
            return "script"
        return "pytest"


def is_test_file(rel_path: str | PurePosixPath) -> bool:
    """The one rule for "is this a test file": `tests/**/test_*.py`.

    Helpers (`tests/test_agent/_fakes.py`), `conftest.py` and `__init__.py` are not.
    """
    p = PurePosixPath(rel_path)
    return (
        len(p.parts) >= 2
        and p.parts[0] == TESTS_DIR
        and p.name.startswith("test_")
        and p.suffix == ".py"
    )


def iter_test_files(root: Path) -> Iterator[str]:
    """Every test file under `root/tests`, as sorted POSIX paths relative to root."""
    tests = root / TESTS_DIR
    if not tests.is_dir():
        return
    found = []
    for path in tests.rglob("test_*.py"):
        rel = path.relative_to(root).as_posix()
        if any(part.startswith(".") or part == "__pycache__" for part in PurePosixPath(rel).parts):
            continue
        if path.is_file() and is_test_file(rel):
            found.append(rel)
    yield from sorted(found)


def _num_gpus(tree: ast.Module) -> tuple[int | None, int | None, str | None]:
    value: int | None = None
    line: int | None = None
    problem: str | None = f"no module-level `{NUM_GPUS} = <int>`; declare how many GPUs the file needs"
    for node in tree.body:
        target: ast.expr | None = None
        expr: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, expr = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, expr = node.target, node.value
        if not (isinstance(target, ast.Name) and target.id == NUM_GPUS):
            continue
        line = node.lineno
        if (
            isinstance(expr, ast.Constant)
            and isinstance(expr.value, int)
            and not isinstance(expr.value, bool)
            and expr.value >= 0
        ):
            value, problem = expr.value, None
        else:
            value = None
            try:
                shown = ast.unparse(expr) if expr is not None else ""
            except RecursionError:
                shown = "a deeply nested expression"
            shown = shown if len(shown) <= 60 else shown[:59] + "…"
            problem = f"`{NUM_GPUS}` must be a non-negative integer literal, got `{shown}`"
    return value, line, problem


def _count_tests(tree: ast.Module) -> int:
    count = 0
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            count += 1
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            count += sum(
                1
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                and item.name.startswith("test")
            )
    return count


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if not (len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False  # `__name__ != "__main__"` runs on import, not as a script
    sides = [test.left, *test.comparators]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    consts = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and consts == ["__main__"]


def _main_runs_something(block: ast.If, local_functions: set[str]) -> bool:
    for node in ast.walk(block):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and (func.value.id, func.attr) in _RUNNER_CALLS):
            return True
        if isinstance(func, ast.Name) and func.id in local_functions:
            return True
    return False


def _unreadable(rel_path: str, why: str) -> TestFile:
    return TestFile(
        path=rel_path, num_gpus=None, num_gpus_line=None,
        num_gpus_problem="the file does not parse", test_functions=0,
        has_main=False, main_runs_something=False, main_line=None, syntax_error=why,
    )


def parse_module(source: str, filename: str) -> ast.Module:
    """`ast.parse`, with the parser's other failures as SyntaxError.

    Nesting too deep for the parser (`not not … 1` 5,000 times, 100,000 `-` signs) raises
    RecursionError or MemoryError from `ast.parse`; one such file must be a finding about
    that file, not the end of every command that reads the tests.
    """
    try:
        return ast.parse(source, filename=filename)
    except (RecursionError, MemoryError):
        raise SyntaxError("nested too deeply for Python's parser", (filename, 1, 0, "")) from None


def read_source(rel_path: str, source: str) -> TestFile:
    """Describe a test file from its source text."""
    try:
        tree = parse_module(source, rel_path)
        return _describe(rel_path, tree)
    except SyntaxError as exc:
        return _unreadable(rel_path, f"line {exc.lineno}: {exc.msg}")
    except RecursionError:  # a tree the parser built but walking it does not fit the stack
        return _unreadable(rel_path, "nested too deeply to read")


def _describe(rel_path: str, tree: ast.Module) -> TestFile:
    num_gpus, line, problem = _num_gpus(tree)
    functions = {
        n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    mains = [n for n in tree.body if _is_main_guard(n)]
    main = mains[-1] if mains else None
    return TestFile(
        path=rel_path,
        num_gpus=num_gpus,
        num_gpus_line=line,
        num_gpus_problem=problem,
        test_functions=_count_tests(tree),
        has_main=main is not None,
        main_runs_something=main is not None
        and _main_runs_something(main, functions),  # type: ignore[arg-type]
        main_line=main.lineno if main is not None else None,
    )


def read_test_file(root: Path, rel_path: str) -> TestFile:
    """Describe `root/rel_path`; a file that cannot be read or decoded is reported, not raised."""
    try:
        with (root / rel_path).open("rb") as f:
            raw = f.read(MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        return _unreadable(rel_path, f"cannot read it ({exc.strerror})")
    if len(raw) > MAX_SOURCE_BYTES:
        return _unreadable(rel_path, f"larger than {MAX_SOURCE_BYTES // (1024 * 1024)} MiB; "
                                     "no test file is that big")
    try:
        source = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return TestFile(
            path=rel_path, num_gpus=None, num_gpus_line=None,
            num_gpus_problem="the file is not UTF-8", test_functions=0, has_main=False,
            main_runs_something=False, main_line=None, syntax_error=str(exc),
        )
    return read_source(rel_path, source)


def discover(root: Path) -> dict[str, TestFile]:
    """Every test file under root, described."""
    return {rel: read_test_file(root, rel) for rel in iter_test_files(root)}
