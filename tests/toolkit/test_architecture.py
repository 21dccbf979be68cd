"""`ci/` has no import circle: every import of every module, read with `ast`, forms a DAG.

Deferred imports inside functions and `TYPE_CHECKING` blocks count too: a circle hidden
behind them still ties two modules into one. The same holds with each subpackage taken
as one node (`ci.backends` -> `ci.run.runner` -> `ci.backends` is a circle between layers even
when no two modules import each other), and the backends import nothing above them.
"""

import ast
import sys
from pathlib import Path

import pytest
from _ci import REPO

NUM_GPUS = 0


def _module(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of `ci` it imports (anywhere in its body)."""
    modules = {_module(p, root): p for p in sorted((root / "ci").rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                if target in modules and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the list of modules around it; None when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with every subpackage of `ci` (ci.backends, ci.history…) one node."""

    def node(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 else module

    merged: dict[str, set[str]] = {}
    for name, targets in graph.items():
        here = node(name)
        merged.setdefault(here, set()).update(t for t in map(node, targets) if t != here)
    # A package's own __init__ and its modules are one node; `ci` itself stays out of it.
    return {k: {t for t in v if t != "ci"} for k, v in merged.items() if k != "ci"}


def test_ci_has_no_import_cycle():
    graph = import_graph(REPO)
    assert "ci.run.command" in graph and "ci.run.runner" in graph["ci.run.command"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or ())


def test_ci_packages_have_no_import_cycle():
    packages = package_graph(import_graph(REPO))
    assert "ci.backends" in packages and "ci.backends" in packages["ci.run.runner"]
    cycle = find_cycle(packages)
    assert cycle is None, "import circle between packages: " + " -> ".join(cycle or ())


def test_the_backends_import_nothing_above_them():
    above = {"ci.run.runner", "ci.run.command", "ci.run.report", "ci.run.timeline"}
    graph = import_graph(REPO)
    found = {name: sorted(targets & above) for name, targets in graph.items()
             if name.startswith("ci.backends") and targets & above}
    assert found == {}


def test_the_check_finds_a_circle_between_packages(tmp_path):
    (tmp_path / "ci" / "pkg").mkdir(parents=True)
    for name, text in {"__init__.py": "", "top.py": "from ci.pkg.a import x\n",
                       "pkg/__init__.py": "", "pkg/a.py": "x = 1\n",
                       "pkg/b.py": "def f():\n    import ci.top\n"}.items():
        (tmp_path / "ci" / name).write_text(text)
    modules = import_graph(tmp_path)
    assert find_cycle(modules) is None  # no two modules import each other
    assert find_cycle(package_graph(modules)) == ["ci.pkg", "ci.top", "ci.pkg"]


def test_the_check_finds_a_circle(tmp_path):
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "__init__.py").write_text("")
    (tmp_path / "ci" / "a.py").write_text("from ci.b import x\n")
    (tmp_path / "ci" / "b.py").write_text("def f():\n    from . import c\n")
    (tmp_path / "ci" / "c.py").write_text("from typing import TYPE_CHECKING\n"
                                          "if TYPE_CHECKING:\n    import ci.a\n")
    assert find_cycle(import_graph(tmp_path)) == ["ci.a", "ci.b", "ci.c", "ci.a"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
