"""`python -m ci bisect`: find the commit that broke an entry (or raised its flake rate).

Exit codes: 0 one commit found, 1 no single commit (the budget ran out, or skipped commits
leave several candidates), 2 bad input or a range that cannot be bisected (its good end
already fails, its bad end passes), 4 --from-monitor and the history store cannot be used,
130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ci.args import Parser, existing_dir, seconds
from ci.bisect.answer import Answer, export_answer, markdown, post_to_streak_issue, record_answer, text
from ci.bisect.driver import (
    STEP_TIMEOUT,
    StepPlan,
    Steps,
    Worktrees,
    bisect,
    commit_range,
    free_sets,
    step_env,
)
from ci.bisect.search import (
    DEFAULT_CONFIDENCE,
    MAX_ATTEMPTS,
    Search,
    attempts_for,
    confidence_of,
    rounds_bound,
)
from ci.errors import EXIT_FAILED, EXIT_OK, StoreError, UsageError
from ci.gpu.allocator import DEFAULT_PATTERN, nvml_gpu_count, validate_pattern
from ci.history.on_branch import on_branch
from ci.history.stats import flakiness, streaks
from ci.history.store import HISTORY_ENV, HISTORY_FILE, describe, open_store, resolve_url
from ci.log import Log
from ci.registry.loader import load_registry
from ci.select.discover import discover
from ci.select.entries import resolve

EMULATED_GPUS = 8
TRIGGERS = ("cli", "monitor", "comment")

_EPILOG = """\
examples:
  python -m ci bisect --suite unit --entry tests/unit/test_x.py --good v1.2 --bad main
  python -m ci bisect --suite megatron --entry 'tests/e2e/test_y.py' --from-monitor --emulate-gpus
  python -m ci bisect --suite unit --entry tests/unit/test_x.py --good A --bad B --dry-run

Each commit is checked out in a temporary git worktree (your checkout is never touched) and
the entry runs there as a session runs it: python -m ci run --suite S --only ENTRY. With g
disjoint GPU sets free under the GPU lock, g commits are tested at once (a (g+1)-ary search).
An entry with a flake history runs k times per commit, k from its rate and --confidence.

exit codes: 0 one commit found, 1 no single commit (budget, or skipped commits next to the
answer), 2 bad input or a range that cannot be bisected, 4 history store unusable
(--from-monitor), 130 interrupted.
"""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m ci bisect", allow_abbrev=False, epilog=_EPILOG,
               formatter_class=argparse.RawDescriptionHelpFormatter,
               description="Find the first commit where an entry fails (or its flake rate rose), "
                           "testing commits in temporary worktrees, in parallel on free GPU sets.")
    p.add_argument("--suite", help="the entry's suite (with --from-monitor: the streak's, by default)")
    p.add_argument("--entry", help="the entry id (a test file path, with its arguments if it has any)")
    p.add_argument("--good", help="a commit where the entry passed")
    p.add_argument("--bad", help="a later commit where it fails (default: HEAD)")
    p.add_argument("--from-monitor", action="store_true",
                   help="take the range from the failure monitor's streak of the entry in the history")
    p.add_argument("--branch", default="main", help="--from-monitor: the branch it watches (default: main)")
    p.add_argument("--branch-only", action="store_true",
                   help="with --good/--bad: refuse ends that are not commits of --branch (the bisect "
                        "workflow's mode, which holds the store's secret; --from-monitor always checks)")
    p.add_argument("-k", dest="streak", type=int, default=3,
                   help="--from-monitor: failures in a row that make a streak (default: 3)")
    p.add_argument("--history", metavar="URL",
                   help=f"run-history store for flake rates, --from-monitor and the answer (default: "
                        f"{HISTORY_ENV}, else {HISTORY_FILE}); 'off' reads and writes nothing")
    p.add_argument("--emulate-gpus", action="store_true", help="GPU entries on emulated GPUs (CPU ranks)")
    p.add_argument("--gpus", type=int,
                   help=f"GPUs of this host (default: detected; {EMULATED_GPUS} emulated)")
    p.add_argument("--lock-path-pattern", help=f"GPU lock files (default: {DEFAULT_PATTERN}; emulated: a "
                                               "private temporary directory)")
    p.add_argument("--parallel", type=int, metavar="G",
                   help="test at most G commits at once (default: the GPU sets free now; 1 for a CPU entry)")
    p.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE,
                   help=f"how sure each commit's verdict must be (default: {DEFAULT_CONFIDENCE})")
    p.add_argument("--flake-rate", type=float, metavar="R",
                   help="the entry's flake rate (default: from the history; 0 without one)")
    p.add_argument("--max-attempts", type=int, default=MAX_ATTEMPTS,
                   help=f"attempts on one commit at most (default: {MAX_ATTEMPTS})")
    p.add_argument("--max-rounds", type=int, help="stop after this many rounds and give the interval "
                                                  "(default: the bound, plus one per skipped commit)")
    p.add_argument("--install", metavar="CMD",
                   help="a command run in each commit's worktree before its entry; if it fails the "
                        "commit is skipped (e.g. 'pip install --no-deps -e .')")
    p.add_argument("--run-arg", action="append", default=[], metavar="ARG",
                   help="one more option for each step's python -m ci run, as --run-arg=--no-prefork "
                        "(repeatable)")
    p.add_argument("--step-timeout", type=float, default=STEP_TIMEOUT,
                   help=f"seconds per attempt (default: {STEP_TIMEOUT:g})")
    p.add_argument("--trigger", choices=TRIGGERS, default="cli", help="who started it (kept in the history)")
    p.add_argument("--work-dir", type=Path, metavar="DIR",
                   help="where the steps' worktrees go (default: the system's temporary directory); "
                        "on a GPU runner a folder of its work dir, which Docker can mount")
    p.add_argument("--answer-dir", type=Path, metavar="DIR",
                   help="also write the answer (Markdown with the streak issue's marker, and JSON) here")
    p.add_argument("--export", type=Path, metavar="DIR",
                   help="also write the answer as DIR/<uid>.json for the history ingest job (a GPU "
                        "runner holds no store URL; its artifact carries the answer to the store)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (commits, rounds bound, attempts per commit) and run nothing")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the repository checkout (default: .)")
    return p


def _rate(args: argparse.Namespace, url: str | None, suite: str, entry: str, warn: bool) -> float:
    if args.flake_rate is not None:
        if not 0 <= args.flake_rate < 1:
            raise UsageError(f"--flake-rate {args.flake_rate:g}: must be at least 0 and below 1")
        return float(args.flake_rate)
    if url is None or (url.startswith("sqlite:///") and not Path(url.split(":///", 1)[1]).is_file()):
        return 0.0  # no store, or none yet: no flake history (and none is created to say so)
    try:
        with open_store(url) as store:
            rows = store.attempts(suite=suite, entries=[entry], last_runs=5000, trusted_only=True)
    except StoreError as exc:
        if warn:
            print(f"bisect: flake rate taken as 0, the history cannot be read ({exc})", file=sys.stderr)
        return 0.0
    found = flakiness(rows).get(entry)
    return found.rate if found is not None else 0.0


def _from_monitor(args: argparse.Namespace, url: str | None, root: Path) -> tuple[str, str, str, str]:
    """(suite, entry, good, bad) of the monitor's streak."""
    if url is None:
        raise UsageError("--from-monitor reads the history; it is off (--history off)")
    # Read only: a mistyped path is an error (exit 4), never a new, empty store without streaks.
    with open_store(url, create=False) as store:
        rows = store.attempts(suite=args.suite, last_runs=5000, trusted_only=True)
    found = [s for s in streaks(rows, branch=args.branch, k=args.streak)
             if args.entry is None or s.entry_id == args.entry]
    if not found:
        what = f"entry {args.entry}" if args.entry else "any entry"
        raise UsageError(f"the monitor finds no streak of {args.streak} failures on {args.branch} for "
                         f"{what}; pass --good and --bad")
    streak = found[0]
    if not streak.last_passing_commit:
        raise UsageError(f"{streak.entry_id} never passed on {args.branch} in the history: nothing is "
                         "known good; pass --good")
    # The history names the commits, and each step runs the code of one: both ends must be on
    # the watched branch itself (reviewed code), checked in the commit graph. A run whose
    # trust was forged could otherwise name a commit of no branch to be run here.
    for end, sha in (("good", streak.last_passing_commit), ("bad", streak.first_failing_commit)):
        if not on_branch(root, sha, args.branch):
            raise UsageError(f"the streak's {end} end {sha[:12]!r} is not a commit of {args.branch} "
                             f"in {root}; nothing of it is run (bisect it by hand with --good and "
                             "--bad if you trust it)")
    return streak.suite, streak.entry_id, streak.last_passing_commit, streak.first_failing_commit


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    root = existing_dir("--root", args.root)
    url = resolve_url(args.history, os.environ, root)
    for flag, value in (("--parallel", args.parallel), ("--max-rounds", args.max_rounds),
                        ("--gpus", args.gpus)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: must be at least 1")
    if args.max_attempts < 1 or args.streak < 1:
        raise UsageError("--max-attempts and -k must be at least 1")
    seconds("--step-timeout", args.step_timeout)
    if args.from_monitor:
        if args.good or args.bad:
            raise UsageError("--from-monitor takes the range from the history; drop --good/--bad")
        suite_name, entry_id, good, bad = _from_monitor(args, url, root)
        if args.suite and args.suite != suite_name:
            raise UsageError(f"the streak of {entry_id} is in suite {suite_name}, not {args.suite}")
    else:
        if not args.suite or not args.entry or not args.good:
            raise UsageError("give --suite, --entry and --good (and --bad, default HEAD), or --from-monitor")
        suite_name, entry_id, good, bad = args.suite, args.entry, args.good, args.bad or "HEAD"
    suite = load_registry(root)[suite_name]
    entries = resolve(suite, discover(root))
    entry = next((e for e in entries if e.id == entry_id), None)
    if entry is None:
        by_path = [e for e in entries if e.path == entry_id]
        if len(by_path) != 1:
            raise UsageError(f"suite {suite.name} has no entry {entry_id!r}; entries: "
                             + ", ".join(e.id for e in entries[:8]))
        entry = by_path[0]
    commits = commit_range(root, good, bad)
    if args.branch_only and not args.from_monitor:
        for flag, ref, commit in (("--good", good, commits[0]), ("--bad", bad, commits[-1])):
            if not on_branch(root, commit.sha, args.branch):
                raise UsageError(f"{flag} {ref!r} ({commit.short()}) is not a commit of {args.branch}: "
                                 "--branch-only runs that branch's commits alone")
    rate = _rate(args, url, suite.name, entry.id, warn=not args.dry_run)
    k_wanted = attempts_for(rate, args.confidence)
    k = min(k_wanted, args.max_attempts)
    emulate = bool(args.emulate_gpus and entry.num_gpus)
    if entry.num_gpus and not emulate and not args.gpus and not nvml_gpu_count():
        raise UsageError(f"{entry.id} needs {entry.num_gpus} GPUs and none is detected; pass "
                         "--emulate-gpus to run it on the CPU, or --gpus N")
    if args.lock_path_pattern is not None:
        validate_pattern(args.lock_path_pattern)
    try:
        install = tuple(shlex.split(args.install)) if args.install else ()
    except ValueError as exc:  # an unbalanced quote
        raise UsageError(f"--install {args.install!r}: {exc}; quote it as a shell would") from None
    log = Log.from_env()
    started = time.time()
    work_dir = existing_dir("--work-dir", args.work_dir) if args.work_dir is not None else None
    trees = None if args.dry_run else Worktrees(root, work_dir)
    try:
        lock_pattern = args.lock_path_pattern
        private = emulate and lock_pattern is None  # the bisect's own emulated GPUs: all free
        if private:
            folder = trees.dir / "locks" if trees else Path("<temporary directory>")
            if trees:
                folder.mkdir()
            lock_pattern = str(folder / "gpu_{gpu_id}.lock")
        total = args.gpus or (EMULATED_GPUS if emulate else nvml_gpu_count() or 0)
        if entry.num_gpus:
            sets = (total // entry.num_gpus if private and trees is None else
                    free_sets(entry.num_gpus, lock_pattern=lock_pattern or DEFAULT_PATTERN, total=total))
            width = max(1, min(sets, args.parallel) if args.parallel else sets)
            where = (f"{sets} free set(s) of {entry.num_gpus} GPU(s) of {total}"
                     + (" (emulated)" if emulate else ""))
        else:
            width = args.parallel or 1
            where = "a CPU entry"
        n = len(commits) - 1
        bound = rounds_bound(n, width, flaky=k > 1)
        max_rounds = args.max_rounds or bound + 4
        plan = StepPlan(suite=suite.name, entry=entry.id, emulate=emulate,
                        gpus=total if entry.num_gpus else None,
                        lock_pattern=lock_pattern if entry.num_gpus else None, install=install,
                        run_args=tuple(args.run_arg), timeout=args.step_timeout)
        log.line(f"bisect {entry.id} ({suite.name}): {n} commit(s) after {commits[0].short()} up to "
                 f"{commits[-1].short()}; {width} at once ({where}); at most {bound} round(s) "
                 "without skipped commits")
        sure = (f"flake rate {rate:.0%}: {k} attempts per commit, each verdict at "
                f"{confidence_of(rate, k):.2%}" if rate else "no flake history: 1 attempt per commit")
        if k < k_wanted:
            sure += (f" -- {args.confidence:.0%} needs {k_wanted}; --max-attempts {args.max_attempts} "
                     "caps it, so the answer is weaker than asked")
        log.line(sure)
        if args.dry_run:
            log.line("commits:")
            for i, c in enumerate(commits):
                end = "  (good end)" if i == 0 else "  (bad end)" if i == n else ""
                log.line(f"  {i:>4}  {c.describe()}{end}")
            log.line(f"each step: {' '.join(shlex.quote(x) for x in plan.run_argv(Path('<step>/junit.xml')))}"
                     + (f"  (after {shlex.join(install)})" if install else ""))
            return EXIT_OK
        assert trees is not None
        search = Search(n=n, width=width, k=k, bad_end_known=k == 1)
        steps = Steps(plan=plan, commits=commits, trees=trees, env=step_env(os.environ), note=log.line)
        outcome = bisect(search, steps, max_rounds=max_rounds, progress=log.line)
    finally:
        if trees is not None:
            trees.close()
    if outcome.refusal:
        log.summary(f"### Bisect of `{entry.id}` ({suite.name})\n\nRefused: {outcome.refusal}")
        raise UsageError(outcome.refusal)
    answer = Answer(suite=suite.name, entry=entry.id, commits=tuple(commits), outcome=outcome, plan=plan,
                    rate=rate, confidence=args.confidence, trigger=args.trigger, started_at=started)
    log.line(text(answer))
    log.summary(markdown(answer))
    if args.answer_dir is not None:
        log.line(f"answer for the streak's issue: {post_to_streak_issue(answer, args.answer_dir)}")
    if args.export is not None:
        folder = args.export if args.export.is_absolute() else root / args.export
        log.line(f"answer exported for the history ingest: {export_answer(answer, folder)}")
    if url is not None:
        try:
            record_answer(url, answer)
            log.line(f"history: answer recorded in {describe(url)}")
        except StoreError as exc:
            print(f"bisect: the answer is not in the history ({exc})", file=sys.stderr)
    return EXIT_OK if answer.commit is not None else EXIT_FAILED
