"""A static import graph of `slime/`, `ci/` and `tests/`, read with `ast` (nothing is imported).

`changed --affected` walks it backwards: from the modules a diff touched to every
test file that imports them, directly or through other modules of this repository.
Nodes are repository-relative POSIX paths; package modules are shown by dotted name.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("slime", "ci")  # importable packages at the repository root
TESTS_DIR = "tests"
_SKIP_DIRS = {"__pycache__", "node_modules"}


def module_name(rel_path: str) -> str | None:
    """`slime/utils/ppo_utils.py` -> `slime.utils.ppo_utils`; None outside the packages."""
    # Plain string work: this runs for every import of every file.
    if not rel_path.endswith(".py") or "/" not in rel_path:
        return None
    parts = rel_path[:-3].split("/")
    if parts[0] not in PACKAGES:
        return None
    if parts[-1] == "__init__":
        parts.pop()
    if not all(part.isidentifier() for part in parts):
        return None
    return ".".join(parts)


def display(node: str) -> str:
    """How a node is named in a reason: dotted for package modules, the path otherwise."""
    return module_name(node) or node


def _iter_python_files(root: Path) -> Iterator[str]:
    for top in (*PACKAGES, TESTS_DIR):
        base = root / top
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames
                                 if not d.startswith(".") and d not in _SKIP_DIRS)
            rel_dir = Path(dirpath).relative_to(root).as_posix()
            for name in sorted(filenames):
                if name.endswith(".py"):
                    yield f"{rel_dir}/{name}"


def _walk_imports(body: Iterable[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    # Imports are statements, so walking statement bodies finds them all (function-local
    # imports included) without visiting every expression node.
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        # except-handlers and match cases carry a `body` of statements too.
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field, None)
            if isinstance(children, list):
                stack.extend(c for c in children if isinstance(c, ast.AST))


def _in_order(nodes: Iterable[ast.Import | ast.ImportFrom]) -> list[ast.Import | ast.ImportFrom]:
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


# An import statement's start (a line beginning, after indentation, with `import` or
# `from`) and its continuation: parenthesised groups (across lines) and backslash-newlines.
_IMPORT_STATEMENT = re.compile(
    rb"^[ \t]*(?:import|from)[ \t\\(](?:[^\n(\\]|\([^)]*\)|\\\n)*", re.MULTILINE)


def _import_lines(source: bytes) -> bytes:
    # Each candidate statement dedented, one after the other, for `ast` to parse alone.
    return b"\n".join(m.lstrip() for m in _IMPORT_STATEMENT.findall(source))


def _parse(source: bytes, filename: str) -> ast.Module:
    # Nesting too deep for the parser is one unreadable file, as a syntax error is.
    try:
        return ast.parse(source, filename=filename)
    except (RecursionError, MemoryError):
        raise SyntaxError("nested too deeply for Python's parser") from None


def import_statements(source: bytes, filename: str = "<source>") -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, read with `ast`; raises SyntaxError like `ast.parse`.

    Parsing whole files costs ~0.5 ms each, too slow for thousands of files, so only the
    lines that can start an import are parsed. When those do not parse on their own (a
    docstring line such as "from the start…"), the whole file is parsed instead. An
    import-like line inside a string that does parse adds an edge too many (a test
    selected without need). Not seen: an import sharing its line with other code
    (`if x: import y`, `a = 1; import y`); write imports on their own lines.
    """
    try:
        snippet = _parse(_import_lines(source), filename)
    except (SyntaxError, ValueError):
        return _in_order(_walk_imports(_parse(source, filename).body))
    # Walked, not just listed: a continuation may have swallowed a block (a comment
    # holding "(" keeps a parenthesis open), and its imports still count.
    return _in_order(_walk_imports(snippet.body))


def _with_parents(dotted: str) -> Iterator[str]:
    # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
    parts = dotted.split(".")
    for i in range(1, len(parts) + 1):
        yield ".".join(parts[:i])


def _package_of(rel_path: str) -> str | None:
    name = module_name(rel_path)
    if name is None:
        return None
    return name if rel_path.endswith("/__init__.py") else name.rpartition(".")[0]


@dataclass(frozen=True, kw_only=True)
class ImportGraph:
    """Which repository files each file imports."""

    imports: Mapping[str, frozenset[str]]  # node -> nodes it imports

    def importers(self) -> dict[str, list[str]]:
        """The reverse edges: node -> sorted nodes that import it."""
        reverse: dict[str, list[str]] = {}
        for node, targets in self.imports.items():
            for target in targets:
                reverse.setdefault(target, []).append(node)
        for nodes in reverse.values():
            nodes.sort()
        return reverse


class _Resolver:
    """Maps import statements of one repository to the files they load."""

    def __init__(self, files: Iterable[str]) -> None:
        self.files = set(files)
        self.modules: dict[str, str] = {}
        self._cache: dict[str, frozenset[str]] = {}
        for rel in self.files:
            name = module_name(rel)
            if name is not None:
                self.modules[name] = rel

    def _local(self, importer: str, name: str) -> str | None:
        # A test file runs with its own directory first on sys.path (as a script and
        # under pytest's default import mode), so `import _fakes` means a sibling file.
        if not importer.startswith(TESTS_DIR + "/"):
            return None
        head = name.split(".", maxsplit=1)[0]
        folder = importer.rpartition("/")[0]
        for candidate in (f"{folder}/{head}.py", f"{folder}/{head}/__init__.py"):
            if candidate in self.files:
                return candidate
        return None

    def _packaged(self, dotted: str) -> frozenset[str]:
        # The same few names are imported everywhere: resolve each once.
        found = self._cache.get(dotted)
        if found is None:
            found = frozenset(self.modules[m] for m in _with_parents(dotted) if m in self.modules)
            self._cache[dotted] = found
        return found

    def _absolute(self, importer: str, dotted: str, names: Iterable[str] = ()) -> set[str]:
        found = set(self._packaged(dotted))
        # `from pkg import name` loads pkg/name.py when name is a submodule.
        found.update(self.modules[sub] for sub in (f"{dotted}.{n}" for n in names)
                     if sub in self.modules)
        local = self._local(importer, dotted)
        if local is not None:
            found.add(local)
        return found

    def targets(self, importer: str,
                statements: Iterable[ast.Import | ast.ImportFrom]) -> frozenset[str]:
        found: set[str] = set()
        for node in statements:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found |= self._absolute(importer, alias.name)
                continue
            names = [a.name for a in node.names if a.name != "*"]
            if node.level == 0:
                if node.module:
                    found |= self._absolute(importer, node.module, names)
                continue
            package = _package_of(importer)
            if package is None:
                continue  # relative imports outside the packages are not resolvable statically
            parts = package.split(".")
            if node.level - 1 > len(parts) - 1:
                continue
            base = ".".join(parts[: len(parts) - (node.level - 1)])
            dotted = f"{base}.{node.module}" if node.module else base
            found |= self._absolute(importer, dotted, names)
        found.discard(importer)
        return frozenset(found)


_WORD = re.compile(rb"\w+")


class _Index:
    """The Python files of a repository, read once; import edges parsed on demand."""

    def __init__(self, root: Path, also_known: Iterable[str] = ()) -> None:
        self.files = list(_iter_python_files(root))
        self.resolver = _Resolver([*self.files, *also_known])
        self.sources: dict[str, bytes] = {}
        self._edges: dict[str, frozenset[str]] = {}
        self._by_word: dict[bytes, list[str]] | None = None
        top = str(root)
        for rel in self.files:
            try:
                with open(os.path.join(top, rel), "rb") as fh:  # not pathlib: 5,000 files
                    self.sources[rel] = fh.read()
            except OSError:
                self.sources[rel] = b""

    def edges(self, rel: str) -> frozenset[str]:
        """The files `rel` imports."""
        found = self._edges.get(rel)
        if found is None:
            try:
                found = self.resolver.targets(rel, import_statements(self.sources[rel], rel))
            except (SyntaxError, ValueError, RecursionError):
                found = frozenset()  # unparsable: its own test run will say so
            self._edges[rel] = found
        return found

    def naming(self, names: Iterable[bytes]) -> set[str]:
        """Files whose import lines mention one of `names` (a file that imports X names X's
        last part)."""
        if self._by_word is None:
            self._by_word = {}
            for rel in self.files:
                for word in set(_WORD.findall(_import_lines(self.sources[rel]))):
                    self._by_word.setdefault(word, []).append(rel)
        return {rel for name in names for rel in self._by_word.get(name, ())}


def build_graph(root: Path, *, also_known: Iterable[str] = ()) -> ImportGraph:
    """Parse every `.py` file of the packages and tests under `root` into an import graph.

    `also_known` names files that no longer exist (deleted or renamed by a diff) so that
    imports of them still resolve: a test importing a deleted module is affected by it.
    """
    index = _Index(root, also_known)
    return ImportGraph(imports={rel: index.edges(rel) for rel in index.files})


def _search(changed: Iterable[str], candidates: Callable[[set[str]], Iterable[str]],
            edges: Callable[[str], frozenset[str]]) -> dict[str, tuple[str, ...]]:
    # Breadth first, one level at a time: a node's chain goes through the smallest
    # (by path) node of the previous level it imports, so results do not depend on
    # the order files are visited in.
    next_hop: dict[str, str | None] = dict.fromkeys(sorted(set(changed)))
    frontier = set(next_hop)
    while frontier:
        reached: dict[str, str] = {}
        for rel in candidates(frontier):
            if rel in next_hop or rel in reached:
                continue
            hits = edges(rel) & frontier
            if hits:
                reached[rel] = min(hits)
        next_hop.update(reached)
        frontier = set(reached)
    chains: dict[str, tuple[str, ...]] = {}
    for node, first in next_hop.items():
        if first is None:
            continue
        chain = [node]
        hop: str | None = first
        while hop is not None:
            chain.append(hop)
            hop = next_hop[hop]
        chains[node] = tuple(chain)
    return chains


def chains_to(graph: ImportGraph, changed: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """For every node that imports a changed node (transitively), its shortest import chain.

    The chain starts at the node and ends at the changed node it reaches:
    `(test, via_1, …, changed)`. Changed nodes themselves are not in the result.
    """
    reverse = graph.importers()
    return _search(
        changed,
        lambda frontier: {rel for node in frontier for rel in reverse.get(node, ())},
        lambda rel: graph.imports.get(rel, frozenset()),
    )


def _leaf(node: str) -> bytes:
    # The last name an import of `node` must spell: `b` of `a.b`, `_fakes` of
    # tests/x/_fakes.py, `pkg` of pkg/__init__.py.
    stem = node[: -len("/__init__.py")] if node.endswith("/__init__.py") else node[:-3]
    return stem.rpartition("/")[2].encode()


def affected_chains(root: Path, changed: Iterable[str], *,
                    also_known: Iterable[str] = ()) -> dict[str, tuple[str, ...]]:
    """`chains_to` over the repository at `root`, parsing only files that could import.

    A file can import a module only if its import lines name the module's last part,
    so each level of the search parses just the files naming one of the frontier's
    (thousands of files, a handful parsed). The one edge this cannot see, a module's
    relative import of its own package, never changes which tests are selected: whoever
    imports that module from outside the package names the package too.
    """
    index = _Index(root, also_known)

    return _search(changed, lambda frontier: index.naming(_leaf(n) for n in frontier),
                   index.edges)


def describe_chain(chain: tuple[str, ...]) -> str:
    """`imports slime.utils.ppo_utils via slime.backends.loss` (nearest module first)."""
    reason = f"imports {display(chain[-1])}"
    if len(chain) > 2:
        reason += " via " + " → ".join(display(n) for n in chain[1:-1])
    return reason
