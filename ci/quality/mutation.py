"""`python -m ci mutation`: do the tests notice when a module's judgement breaks?

For each target of `ci.quality.mutation_targets.MUTATION_TARGETS`, mutmut rewrites one operator, constant or
string at a time in a scratch copy of the checkout (the checkout itself is never edited:
an interrupted run leaves nothing mutated behind), reruns the target's tests that reach
the mutated function, and records whether they failed (killed) or passed (survived).
The score of a module is killed / (mutants - equivalent); under its registered threshold
the command exits 1. Equivalent mutants, which no test can tell from the original, are
listed with their reason in `MUTATION_EQUIVALENT`.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ci import proc
from ci.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, UsageError
from ci.interrupts import PROCESS, Interrupts
from ci.quality.mutation_targets import MUTATION_EQUIVALENT, MUTATION_TARGETS, MutationTarget

# mutmut's exit codes per mutant (mutmut/stats.py), grouped as this command counts them.
# A timeout or a crashed test process is a behaviour change the tests noticed.
KILLED_CODES = frozenset({1, 3, 36, 37, 24, -24, 152, 255, -11, -9})
SURVIVED_CODES = frozenset({0})
NO_TESTS_CODES = frozenset({5, 33})
# Lines never mutated: what `--help` says is documentation, not the module's judgement.
NOT_MUTATED = (r"^\s*help=", r"\bhelp=f?\"", r"description=", r"epilog=")
# What the scratch copy leaves out: build and cache folders, and the git directory.
SKIP = (".git", ".nox", ".ci-cache", ".venv", "mutants", "__pycache__", "*.pyc", ".mypy_cache",
        ".ruff_cache", ".pytest_cache", "*.egg-info", "build", "dist")


@dataclass(frozen=True, kw_only=True)
class Mutant:
    """One mutant and what became of it."""

    name: str  # mutmut's key: module.x_function__mutmut_N
    status: str  # killed | survived | no tests | equivalent | not checked
    line: str = ""  # the mutated line, as the mutant has it
    original: str = ""  # the same line before the mutation
    reason: str = ""  # why it is equivalent


@dataclass(frozen=True, kw_only=True)
class Score:
    """The outcome of one target."""

    target: MutationTarget
    mutants: tuple[Mutant, ...]
    seconds: float

    def count(self, status: str) -> int:
        return sum(m.status == status for m in self.mutants)

    @property
    def counted(self) -> int:
        return len(self.mutants) - self.count("equivalent")

    @property
    def score(self) -> float:
        return self.count("killed") / self.counted if self.counted else 1.0

    @property
    def ok(self) -> bool:
        return self.counted > 0 and self.count("not checked") == 0 and self.score >= self.target.threshold

    @property
    def survivors(self) -> tuple[Mutant, ...]:
        return tuple(m for m in self.mutants if m.status in ("survived", "no tests", "not checked"))


@dataclass(frozen=True, kw_only=True)
class Equivalent:
    """A mutant no test can kill: its key, its mutated line (to notice a stale entry), why."""

    name: str
    line: str
    reason: str


# --- the equivalents file ------------------------------------------------------------------


def parse_equivalents(text: str, *, source: str = MUTATION_EQUIVALENT) -> dict[str, Equivalent]:
    """Blocks of `mutant NAME` / `line TEXT` / `why REASON`, separated by blank lines."""
    found: dict[str, Equivalent] = {}
    block: dict[str, str] = {}
    lines = [*text.splitlines(), ""]
    for number, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if stripped.startswith("#"):
            continue
        if not stripped:
            if block:
                missing = [k for k in ("mutant", "line", "why") if not block.get(k)]
                if missing:
                    raise UsageError(f"{source}:{number - 1}: entry lacks {', '.join(missing)} "
                                     f"(each entry: mutant NAME, line TEXT, why REASON)")
                found[block["mutant"]] = Equivalent(name=block["mutant"], line=block["line"],
                                                    reason=block["why"])
                block = {}
            continue
        key, _, value = stripped.partition(" ")
        if key not in ("mutant", "line", "why") or key in block:
            raise UsageError(f"{source}:{number}: expected `mutant NAME`, `line TEXT` or `why REASON`, "
                             f"got {stripped[:60]!r}")
        block[key] = value.strip()
    return found


# --- reading mutmut's results ---------------------------------------------------------------


def status_of(exit_code: int | None) -> str:
    """How this command counts a mutant with mutmut's exit code."""
    if exit_code is None:
        return "not checked"
    if exit_code in SURVIVED_CODES:
        return "survived"
    if exit_code in NO_TESTS_CODES:
        return "no tests"
    if exit_code in KILLED_CODES:
        return "killed"
    # Killed by a signal the mutant brought on (SIGALRM from a timer it left armed, SIGABRT):
    # a crash the tests noticed. Only SIGINT is somebody stopping the run.
    if exit_code < 0 and exit_code != -signal.SIGINT:
        return "killed"
    return "survived"  # mutmut's "suspicious" and anything new: not a kill


def _functions(source: str) -> dict[str, str]:
    # By line numbers: ast.get_source_segment splits the whole file on every call, and a
    # mutated module holds thousands of functions.
    lines = source.splitlines()
    return {node.name: "\n".join(lines[node.lineno - 1:node.end_lineno])
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def changed_line(functions: Mapping[str, str], name: str) -> tuple[str, str]:
    """(original line, mutated line) of mutant `name` in the mutated module's functions."""
    function = name.rpartition(".")[2]
    base = function.rpartition("__mutmut_")[0]
    mutated, original = functions.get(function, ""), functions.get(f"{base}__mutmut_orig", "")
    # The def lines differ by the mutant's own name (and may hold the mutation: a default).
    before = original.replace(f"{base}__mutmut_orig", base, 1).splitlines()
    after = mutated.replace(function, base, 1).splitlines()
    old = new = ""
    for line in difflib.unified_diff(before, after, lineterm="", n=0):
        if line.startswith("-") and not line.startswith("---") and not old:
            old = line[1:].strip()
        elif line.startswith("+") and not line.startswith("+++") and not new:
            new = line[1:].strip()
    return old, new


def read_results(scratch: Path, target: MutationTarget,
                 equivalents: Mapping[str, Equivalent]) -> tuple[Mutant, ...]:
    """The mutants of `target` as mutmut left them under scratch/mutants."""
    mutants_dir = scratch / "mutants"
    where = mutants_dir / target.source
    metas = sorted(where.rglob("*.py.meta")) if where.is_dir() else [mutants_dir / f"{target.source}.meta"]
    found: list[Mutant] = []
    for meta in metas:
        if not meta.is_file():
            continue
        codes: dict[str, int | None] = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
        functions = _functions(meta.with_suffix("").read_text(encoding="utf-8"))
        for name in sorted(codes, key=_natural):
            original, line = changed_line(functions, name)
            status = status_of(codes[name])
            known = equivalents.get(name)
            if status != "killed" and known is not None and known.line == line:
                found.append(Mutant(name=name, status="equivalent", line=line, original=original,
                                    reason=known.reason))
            else:
                found.append(Mutant(name=name, status=status, line=line, original=original))
    return tuple(found)


def stale_equivalents(target: MutationTarget, mutants: Sequence[Mutant],
                      equivalents: Mapping[str, Equivalent]) -> list[str]:
    """Entries of the equivalents file for this target that no longer hold: the code moved on
    (no such mutant, or the number now names another line: new code above renumbers every
    mutant below it, killed ones included), or the tests now kill that very mutant."""
    prefix = target.source.removesuffix(".py").replace("/", ".") + "."
    by_name = {m.name: m for m in mutants}
    out = []
    for name, eq in sorted(equivalents.items()):
        if not name.startswith(prefix) or (name in by_name and by_name[name].status == "equivalent"):
            continue
        now = by_name.get(name)
        if now is None:
            out.append(f"stale entry in {MUTATION_EQUIVALENT}: no mutant {name} any more")
        elif now.line != eq.line:
            out.append(f"stale entry in {MUTATION_EQUIVALENT}: {name} now mutates `{now.line}`, "
                       f"not `{eq.line}`; check it again")
        elif now.status == "killed":
            out.append(f"stale entry in {MUTATION_EQUIVALENT}: the tests kill {name} now, so it is "
                       f"not equivalent; remove the entry")
    return out


def _natural(name: str) -> tuple[str, int]:
    stem, _, number = name.rpartition("__mutmut_")
    return stem, int(number) if number.isdigit() else -1


# --- running mutmut -------------------------------------------------------------------------


def mutmut_config(target: MutationTarget, copied: Iterable[str]) -> str:
    """The `[tool.mutmut]` table for one target (mutmut reads it from the scratch pyproject)."""
    return "\n".join((
        "",
        "[tool.mutmut]",
        f"source_paths = {json.dumps([target.source])}",
        f"pytest_add_cli_args_test_selection = {json.dumps(list(target.tests))}",
        # Tests read files at the root (noxfile.py, README.md, the workflows): copy it all.
        f"also_copy = {json.dumps(sorted(copied))}",
        f"do_not_mutate_patterns = {json.dumps(list(NOT_MUTATED))}",
        "",
    ))


def prepare(root: Path, scratch: Path, target: MutationTarget) -> None:
    """A copy of the checkout at `scratch` whose pyproject tells mutmut what to do."""
    shutil.copytree(root, scratch, ignore=shutil.ignore_patterns(*SKIP), symlinks=True)
    copied = [p.name for p in scratch.iterdir() if p.name not in ("pyproject.toml",)]
    with (scratch / "pyproject.toml").open("a", encoding="utf-8") as f:
        f.write(mutmut_config(target, copied))


def run_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a mutmut run: the mutated copy must be what `import ci` finds."""
    out = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    # mutmut forks each mutant's test run from a process that already ran torch: with one
    # OpenMP thread there is no thread pool for the child to inherit half-initialised.
    out.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    return out


class Interrupted(Exception):
    """SIGINT or SIGTERM came while a target was being mutated; mutmut has been stopped."""


STOP_GRACE = 10.0  # seconds mutmut gets to end its workers after SIGTERM, before SIGKILL


def _mutmut(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log: Path,
            interrupts: Interrupts) -> int:
    """Run mutmut in a process group of its own; on a signal, stop all of it and raise."""
    guard = proc.process_guard()  # and if this process is killed outright, the group dies too
    with log.open("wb") as out:
        child = proc.start(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, guard=guard)
        while not proc.wait_exit(child.pid, 0.5) and not interrupts.received:
            pass
        # Done or stopped: either way no process of its group (a forked worker) outlives it.
        proc.stop_group(child.pid, STOP_GRACE)
        code = proc.finish(child, guard=guard)
    if interrupts.received:
        raise Interrupted
    return code


def run_target(root: Path, target: MutationTarget, *, jobs: int, equivalents: Mapping[str, Equivalent],
               keep: Path | None, env: Mapping[str, str], interrupts: Interrupts = PROCESS) -> Score:
    """Mutate one target in a scratch copy and collect its score (Interrupted on a signal;
    the scratch copy is removed either way, unless `keep` names where it stays)."""
    started = time.monotonic()
    holder = tempfile.TemporaryDirectory(prefix="slime-ci-mutation-")
    try:
        scratch = (keep / target.source.replace("/", "_")) if keep else Path(holder.name) / "tree"
        if scratch.exists():
            shutil.rmtree(scratch)
        prepare(root, scratch, target)
        argv = [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)]
        print(f"mutation: {target.source}: {' '.join(argv[1:])} (in {scratch})", flush=True)
        log = scratch / "mutmut.log"
        code = _mutmut(argv, cwd=scratch, env=run_env(env), log=log, interrupts=interrupts)
        mutants = read_results(scratch, target, equivalents)
        if code != 0 or not mutants:
            tail = log.read_text(encoding="utf-8", errors="replace").replace("\r", "\n").splitlines()[-15:]
            print("\n".join(f"  | {line}" for line in tail), flush=True)
            print(f"mutation: {target.source}: mutmut exited {code} (its log above); a test "
                  f"that fails before any mutation must be fixed first", flush=True)
        for line in stale_equivalents(target, mutants, equivalents):
            print(f"mutation: {line}", flush=True)
        return Score(target=target, mutants=mutants, seconds=time.monotonic() - started)
    finally:
        holder.cleanup()


# --- the report -----------------------------------------------------------------------------


def render(scores: Sequence[Score]) -> str:
    """Survivors per module, then one row per module: killed, survived, equivalent, score."""
    lines: list[str] = []
    for s in scores:
        for m in s.survivors:
            lines.append(f"  {m.status:<11}  {m.name}")
            if m.original or m.line:
                lines.append(f"               - {m.original}")
                lines.append(f"               + {m.line}")
    header = ("module", "mutants", "killed", "survived", "no tests", "equiv.", "score", "needs", "seconds")
    rows = [header] + [
        (s.target.source, str(len(s.mutants)), str(s.count("killed")), str(s.count("survived")),
         str(s.count("no tests")), str(s.count("equivalent")), f"{s.score:.1%}" if s.counted else "-",
         f"{s.target.threshold:.0%}",
         f"{s.seconds:.0f}")
        for s in scores
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines.append("")
    for i, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    failing = [s.target.source for s in scores if not s.ok]
    lines.append(f"mutation: {len(scores) - len(failing)} of {len(scores)} modules at their threshold"
                 + (f"; under it: {', '.join(failing)}" if failing else ""))
    return "\n".join(lines)


def progress(s: Score) -> str:
    """One target's result as it finishes (a run of every target takes most of an hour)."""
    verdict = "ok" if s.ok else "UNDER THRESHOLD"
    return (f"{s.target.source}: {s.count('killed')} of {s.counted} killed "
            f"({s.score:.1%}, needs {s.target.threshold:.0%}; {s.count('equivalent')} equivalent), "
            f"{s.seconds:.0f} s: {verdict}")


def pick(targets: Sequence[MutationTarget], names: Sequence[str]) -> list[MutationTarget]:
    """The targets named (by source path), all when none are."""
    if not names:
        return list(targets)
    known = {t.source: t for t in targets}
    unknown = [n for n in names if n.rstrip("/") not in known]
    if unknown:
        raise UsageError(f"not a mutation target: {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n.rstrip("/")] for n in names]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci mutation", description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="targets to mutate (their source path); default: all")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: cwd)")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                        help="mutants tested at once (default: the CPU count)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep each target's mutated copy under this directory (for mutmut show)")
    parser.add_argument("--dry-run", action="store_true", help="print the targets and their tests")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: need at least 1")
    root = args.root.resolve()
    targets = pick(MUTATION_TARGETS, args.modules)
    missing = [p for t in targets for p in (t.source, *t.tests) if not (root / p).exists()]
    if missing:
        raise UsageError(f"not in {root}: {', '.join(missing)} "
                         "(fix MUTATION_TARGETS in ci/quality/mutation_targets.py)")
    if args.dry_run:
        for t in targets:
            print(f"{t.source}  needs {t.threshold:.0%}  tests: {' '.join(t.tests)}")
        return EXIT_OK
    try:
        import mutmut  # noqa: F401  (only to say which profile brings it)
    except ModuleNotFoundError:
        raise UsageError("mutmut is not installed: install the `mutation` profile "
                         "(pip install -e '.[mutation]'), or run `nox -s mutation`") from None
    equivalents_path = root / MUTATION_EQUIVALENT
    equivalents = (parse_equivalents(equivalents_path.read_text(encoding="utf-8"))
                   if equivalents_path.is_file() else {})
    # `python -m ci` records SIGINT/SIGTERM for this command (ci/cli.py): the run stops mutmut.
    scores, stopped = run_all(root, targets, jobs=args.jobs, equivalents=equivalents, keep=args.keep,
                              env=os.environ, interrupts=PROCESS)
    if scores:
        print(render(scores), flush=True)
    if stopped is not None:
        print(f"mutation: interrupted while mutating {stopped.source}; {len(scores)} of {len(targets)} "
              f"targets finished (above), mutmut stopped, its scratch copy removed", flush=True)
        return EXIT_INTERRUPTED
    return EXIT_OK if all(s.ok for s in scores) else EXIT_FAILED


def run_all(root: Path, targets: Sequence[MutationTarget], *, jobs: int,
            equivalents: Mapping[str, Equivalent], keep: Path | None, env: Mapping[str, str],
            interrupts: Interrupts) -> tuple[list[Score], MutationTarget | None]:
    """Each target in turn, its score said as it finishes; the target a signal stopped, if any."""
    scores: list[Score] = []
    for i, target in enumerate(targets, 1):
        try:
            scores.append(run_target(root, target, jobs=jobs, equivalents=equivalents, keep=keep,
                                     env=env, interrupts=interrupts))
        except Interrupted:
            return scores, target
        print(f"mutation: [{i}/{len(targets)}] {progress(scores[-1])}", flush=True)
    return scores, None
