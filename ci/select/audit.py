"""`python -m ci audit`: every test file registered, declaring NUM_GPUS, and running something.

Each finding names file and line. It works on any checkout (`--root`): a checkout
without a registry (`.slime-ci/suites.py` or `ci/registry/repo_suites.py`) still gets every per-file
finding; every registry finding names the file the checkout's registry lives in.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ci.errors import EXIT_FAILED, EXIT_OK, NothingRegistered, UsageError
from ci.registry.loader import REGISTRY, REGISTRY_PATHS, Registry, load_registry
from ci.registry.model import Suite
from ci.select.discover import TestFile, discover
from ci.select.entries import rule_files


@dataclass(frozen=True, kw_only=True, order=True)
class Finding:
    """One problem, where it is and what to do about it."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def file_findings(tf: TestFile, *, config_check: bool = False) -> list[Finding]:
    """Problems visible in the file alone (`config_check`: a registered 0-GPU script of a GPU suite)."""
    out: list[Finding] = []
    if tf.syntax_error:
        return [Finding(path=tf.path, line=1, message=f"does not parse ({tf.syntax_error})")]
    if tf.num_gpus is None:
        out.append(Finding(path=tf.path, line=tf.num_gpus_line or 1,
                           message=f"{tf.num_gpus_problem} (e.g. `NUM_GPUS = 0` for a CPU test)"))
        return out
    main_line = tf.main_line or 1
    if tf.num_gpus == 0 and tf.test_functions == 0 and not (config_check and tf.kind == "script"):
        out.append(Finding(path=tf.path, line=1,
                           message="NUM_GPUS = 0 but no test functions: the file would run nothing"))
    elif tf.test_functions == 0 and not tf.has_main:
        out.append(Finding(path=tf.path, line=1, message="e2e script without an "
                           "`if __name__ == \"__main__\":` block: running it does nothing"))
    elif not tf.has_main:
        out.append(Finding(path=tf.path, line=1, message="no `if __name__ == \"__main__\":` block: "
                           "`python <file>` runs nothing; end it with "
                           "`raise SystemExit(pytest.main([__file__, *sys.argv[1:]]))`"))
    elif not tf.main_runs_something:
        out.append(Finding(path=tf.path, line=main_line, message="the `__main__` block calls neither "
                           "pytest.main nor a function of the file: `python <file>` runs nothing"))
    return out


def registry_findings(suites: Sequence[Suite], files: Mapping[str, TestFile], *,
                      registry: str = REGISTRY) -> list[Finding]:
    """Problems between the registry and the files: unregistered, missing, GPU count mismatches.

    `registry` names the file the suites came from (Registry.name) in the messages.
    """
    out: list[Finding] = []
    claimed: set[str] = set()
    for suite in suites:
        claimed.update(rule_files(suite, files))
        for entry in suite.entries:
            claimed.add(entry.path)
            tf = files.get(entry.path)
            where = f"registered in suite {suite.name} ({registry})"
            if tf is None:
                out.append(Finding(path=entry.path, line=0,
                                   message=f"{where} but the file does not exist"))
                continue
            if tf.num_gpus is None:
                continue  # already reported by file_findings
            if suite.needs_gpus and tf.num_gpus == 0 and not entry.cpu_only:
                out.append(Finding(path=entry.path, line=tf.num_gpus_line or 1, message=(
                    f"{where}, a GPU suite, but NUM_GPUS = 0; move it to a CPU suite or mark "
                    "the entry cpu_only=True if it is a deliberate config check")))
            if not suite.needs_gpus and tf.num_gpus > 0:
                out.append(Finding(path=entry.path, line=tf.num_gpus_line or 1, message=(
                    f"{where}, a CPU suite, but NUM_GPUS = {tf.num_gpus}")))
    for path, tf in files.items():
        if path in claimed or tf.num_gpus is None:
            continue
        hint = ("add an Entry to a GPU suite" if tf.num_gpus
                else "put it under a directory a CPU suite includes")
        out.append(Finding(path=path, line=tf.num_gpus_line or 1,
                           message=f"in no suite (NUM_GPUS = {tf.num_gpus}); {hint} in {registry}"))
    return out


def audit(root: Path, registry: Registry | None = None) -> tuple[list[Finding], int, bool]:
    """All findings for the checkout at root, the number of test files, and whether a registry was read.

    Registry checks need the checkout's own registry; without one, only per-file checks run.
    """
    files = discover(root)
    registry = registry if registry is not None else load_registry(root)
    suites = registry.suites if registry.source is not None else None
    config_checks = {e.path for s in suites or () if s.needs_gpus for e in s.entries if e.cpu_only}
    findings = [f for tf in files.values()
                for f in file_findings(tf, config_check=tf.path in config_checks)]
    if suites is not None:
        findings += registry_findings(suites, files, registry=registry.name)
    return sorted(set(findings)), len(files), suites is not None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `python -m ci audit --help`)")


def main(argv: Sequence[str]) -> int:
    p = _Parser(prog="python -m ci audit", description=(
        "Check every test file under tests/: declares NUM_GPUS (read by AST), runs something, "
        "and belongs to exactly the suites its GPU count allows. Exit 1 when anything is wrong."))
    p.add_argument("--root", type=Path, default=Path.cwd(), help="checkout to audit (default: .)")
    args = p.parse_args(list(argv))
    root = args.root.resolve()
    try:
        has_tests = (root / "tests").is_dir()
    except OSError as exc:  # is_dir() raises for a name too long, a loop of links
        raise UsageError(f"--root {root}: cannot be used ({exc.strerror})") from None
    if not has_tests:
        raise UsageError(f"{root} has no tests/ directory; pass the repository root with --root")
    findings, count, registry = audit(root, load_registry(root))
    if not count:
        raise NothingRegistered(f"{root / 'tests'} holds no test files (tests/**/test_*.py): "
                                "nothing to audit")
    for finding in findings:
        print(finding)
    scope = "" if registry else f" (no {' or '.join(REGISTRY_PATHS)} here: per-file checks only)"
    if findings:
        files = len({f.path for f in findings})
        print(f"audit: {len(findings)} problem(s) in {files} of {count} test files{scope}")
        return EXIT_FAILED
    print(f"audit: {count} test files, no problems{scope}")
    return EXIT_OK
