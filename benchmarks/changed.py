"""Benchmark `changed`: plan a typical PR diff in a generated repository of ~5,000 files and
~2,000 commits. Goal: under 1 s.

    python benchmarks/changed.py [--files 5000] [--commits 2000] [--runs 7] [--keep DIR]

The history is written with one `git fast-import` stream (seconds, not minutes). The
branch forks 50 commits before the tip of main and carries a typical PR: two source
modules edited, three test files edited, one added, one renamed, one deleted.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ci.select.changed import ChangedSelection, select_changed

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
PACKAGES = 40
CORE = 20  # the first modules: imported from everywhere, like slime.utils


def _git(root: Path, *args: str, stdin: bytes | None = None) -> None:
    subprocess.run(["git", *args], cwd=root, input=stdin, check=True, timeout=600,
                   env={**os.environ, **GIT_ENV}, stdout=subprocess.DEVNULL)


class History:
    """Builds a fast-import stream: files of a growing tree, one commit at a time."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.modules: list[str] = []  # dotted names, in creation order
        self.tests: list[str] = []
        self.contents: dict[str, str] = {}  # latest text of every test file
        self.by_package: dict[str, list[str]] = {}
        self.chunks: list[bytes] = []
        self.mark = 0
        self.time = 1_700_000_000

    def module_source(self, name: str) -> str:
        # Like a real package: a few older modules of the same package, sometimes one of
        # the core modules every package leans on. Acyclic, some levels deep.
        package = name.rpartition(".")[0]
        own = [m for m in self.by_package.get(package, []) if m < name]
        deps = set(self.rng.sample(own, min(len(own), self.rng.randint(0, 2))))
        if self.modules and self.rng.random() < 0.3:
            deps.add(self.rng.choice(self.modules[:CORE]))
        deps.discard(name)
        imports = "".join(f"import {d}\n" for d in sorted(deps))
        body = "".join(f"\n\ndef f{i}(x: int) -> int:\n    return x * {i} + 1\n"
                       for i in range(self.rng.randint(5, 20)))
        return f'"""Module {name}."""\n\n{imports}{body}'

    def test_source(self, gpus: int) -> str:
        package = self.rng.choice(sorted(self.by_package))
        members = self.by_package[package]
        deps = self.rng.sample(members, min(len(members), self.rng.randint(1, 2)))
        imports = "".join(f"import {d}\n" for d in sorted(deps))
        tests = "".join(f"\n\ndef test_{i}():\n    assert {i} + 1 == {i + 1}\n"
                        for i in range(self.rng.randint(2, 8)))
        return (f"import sys\n\nimport pytest\n\n{imports}\nNUM_GPUS = {gpus}\n{tests}\n\n"
                'if __name__ == "__main__":\n'
                '    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))\n')

    def new_module(self) -> tuple[str, str]:
        name = f"slime.pkg{len(self.modules) % PACKAGES:02d}.mod{len(self.modules):05d}"
        source = self.module_source(name)
        self.modules.append(name)
        self.by_package.setdefault(name.rpartition(".")[0], []).append(name)
        return name.replace(".", "/") + ".py", source

    def new_test(self) -> tuple[str, str]:
        folder = self.rng.choice(["tests", "tests/utils", "tests/rollout", "tests/e2e/short"])
        path = f"{folder}/test_case{len(self.tests):05d}.py"
        self.tests.append(path)
        self.contents[path] = self.test_source(8 if "e2e" in folder else 0)
        return path, self.contents[path]

    def commit(self, ref: str, message: str, files: dict[str, str | None],
               parent: str | None = None) -> str:
        self.mark += 1
        self.time += 600
        lines = [f"commit {ref}", f"mark :{self.mark}",
                 f"committer Bench <bench@example.invalid> {self.time} +0000"]
        data = message.encode()
        head = "\n".join(lines).encode() + f"\ndata {len(data)}\n".encode() + data + b"\n"
        if parent:
            head += f"from {parent}\n".encode()
        ops = []
        for path, text in files.items():
            if text is None:
                ops.append(f"D {path}\n".encode())
                continue
            blob = text.encode()
            ops.append(f"M 100644 inline {path}\ndata {len(blob)}\n".encode() + blob + b"\n")
        self.chunks.append(head + b"".join(ops) + b"\n")
        return f":{self.mark}"


def generate(root: Path, *, files: int, commits: int, seed: int = 7) -> None:
    """Write the repository: main (with origin/main) and a checked-out PR branch `feature`."""
    rng = random.Random(seed)
    h = History(rng)
    root.mkdir(parents=True, exist_ok=True)
    _git(root, "init", "--quiet", "-b", "main", ".")
    base_files = files // 5
    initial: dict[str, str | None] = {"pyproject.toml": "[project]\nname = 'bench'\n"}
    for i in range(PACKAGES):
        initial[f"slime/pkg{i:02d}/__init__.py"] = ""
    initial["slime/__init__.py"] = ""
    for i in range(base_files - len(initial)):
        if i % 5 == 4:
            initial[f"docs/page{i:05d}.md"] = f"# Page {i}\n"
        else:
            path, text = h.new_module() if i % 5 < 3 else h.new_test()
            initial[path] = text
    tip = h.commit("refs/heads/main", "initial", initial)
    per_commit = max(1, (files - base_files) // max(1, commits - 1))
    fork = ""
    for n in range(1, commits):
        change: dict[str, str | None] = {}
        for _ in range(per_commit):
            path, text = h.new_module() if rng.random() < 0.6 else h.new_test()
            change[path] = text
        victim = rng.choice(h.modules)
        change[victim.replace(".", "/") + ".py"] = h.module_source(victim) + f"\n# rev {n}\n"
        tip = h.commit("refs/heads/main", f"change {n}", change)
        if n == commits - 50:
            fork = tip
    # A typical PR, forked 50 commits before main's tip: two modules of two packages,
    # test files edited, added, renamed and deleted.
    tests = [t for t in h.tests[:-200] if "e2e" not in t]
    touched = [h.by_package["slime.pkg17"][5], h.by_package["slime.pkg23"][12]]
    edits: dict[str, str | None] = {
        m.replace(".", "/") + ".py": h.module_source(m) + "\n# pr\n" for m in touched}
    pr = h.commit("refs/heads/feature", "pr: tune", {
        **edits,
        tests[3]: h.test_source(0) + "\n# pr\n",
        tests[30]: h.test_source(0) + "\n# pr\n",
        "tests/e2e/test_pr_new.py": h.test_source(8),
    }, parent=fork)
    h.commit("refs/heads/feature", "pr: tidy", {
        tests[50]: h.test_source(0) + "\n# pr 2\n",
        tests[60]: None,
        tests[70]: None,  # renamed, content kept: git's rename detection pairs them
        "tests/utils/test_renamed_in_pr.py": h.contents[tests[70]],
    }, parent=pr)
    # The worst case for --affected: a PR that edits a core module.
    core = h.modules[0]
    h.commit("refs/heads/feature-core", "pr: core",
             {core.replace(".", "/") + ".py": h.module_source(core) + "\n# pr\n"}, parent=fork)
    stream = b"".join(h.chunks) + f"reset refs/remotes/origin/main\nfrom {tip}\n\n".encode()
    _git(root, "fast-import", "--quiet", stdin=stream)
    _git(root, "checkout", "--quiet", "feature")


def median_seconds(fn: Callable[[], ChangedSelection], runs: int) -> tuple[float, float, ChangedSelection]:
    """Median wall and CPU seconds (this process, git's children excluded) of `runs` calls,
    and the last result. CPU time shows the cost when other work shares the cores."""
    walls, cpus = [], []
    result = fn()  # warm the page cache: CI checks out the tree just before planning
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return statistics.median(walls), statistics.median(cpus), result


def _quiet(message: str) -> None:
    pass


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--keep", type=Path,
                        help="build the repository here and keep it (reused when present)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="changed-bench-") as tmp:
        root = args.keep or Path(tmp) / "repo"
        start = time.perf_counter()
        if not (root / ".git").is_dir():  # --keep DIR of an earlier run: reuse it
            generate(root, files=args.files, commits=args.commits)
        built = time.perf_counter() - start
        how = f"built in {built:.1f} s" if built > 0.5 else f"reused from {root}"
        tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True,
                                 check=True, timeout=60).stdout.count(b"\n")
        count = subprocess.run(["git", "rev-list", "--count", "--all"], cwd=root,
                               capture_output=True, check=True, timeout=60).stdout.strip()
        print(f"repository: {tracked} files, {count.decode()} commits ({how})")
        scenarios = (("feature", "changed", False), ("feature", "changed --affected", True),
                     ("feature-core", "changed --affected, core module edited", True))
        for branch, label, affected in scenarios:
            _git(root, "checkout", "--quiet", branch)
            seconds, cpu, plan = median_seconds(
                functools.partial(select_changed, root, affected=affected, warn=_quiet), args.runs)
            print(f"{label:<40} median {seconds * 1000:6.1f} ms ({cpu * 1000:5.1f} ms CPU) "
                  f"over {args.runs} runs, {len(plan.entries):4d} test files selected "
                  f"(goal < 1000 ms: {'met' if seconds < 1 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
