"""`python -m ci hud --out DIR`: the history as a static site (the grid, entries, runs, GPUs).

Exit codes: 0 written, 2 bad input, 4 the history store cannot be used.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from ci.args import Parser
from ci.errors import EXIT_OK, UsageError
from ci.history.store import HISTORY_ENV, HISTORY_FILE, open_store, resolve_url
from ci.history.verdicts import SuiteRules
from ci.hud.read import read
from ci.hud.site import Settings, render, write
from ci.registry.loader import load_registry
from ci.registry.model import (
    AUTO_QUARANTINE_CLEAN_RUNS,
    AUTO_QUARANTINE_MIN_RUNS,
    AUTO_QUARANTINE_RATE,
    Suite,
)


def build_parser() -> Parser:
    p = Parser(prog="python -m ci hud", allow_abbrev=False,
               description="Build the HUD: a static site of the run history (no server, no script): "
                           "the last commits of a branch by every entry, each entry's trends, "
                           "each run, GPU use per host and day.",
               epilog="Exit codes: 0 written, 2 bad input, 4 the history store cannot be used.")
    p.add_argument("--out", type=Path, required=True, help="the folder to write (replaced)")
    p.add_argument("--history", metavar="URL",
                   help=f"store URL (default: {HISTORY_ENV}, else {HISTORY_FILE})")
    p.add_argument("--root", type=Path, default=Path.cwd(),
                   help="repository root, for its registry (default: .)")
    p.add_argument("--branch", default="main", help="the branch whose commits the grid shows (default: main)")
    p.add_argument("--commits", type=int, default=50, help="commits shown (default: 50)")
    p.add_argument("--last-runs", type=int, default=3000,
                   help="newest trusted runs of the branch read (default: 3000)")
    p.add_argument("--include-prs", action="store_true",
                   help="also a page per pull request: the verdicts of its latest runs (untrusted "
                        "runs, shown apart; never in the grid)")
    p.add_argument("--repo", default=None, metavar="OWNER/NAME",
                   help="for links to commits and issues (default: GITHUB_REPOSITORY; none without it)")
    return p


def _rules(suites: Sequence[Suite]) -> dict[str, SuiteRules]:
    # As the verdict check reads them (ci/github/pr_verdicts.py suite_rules), without its
    # registry validation: a page shows what was recorded, whatever the registry says now.
    return {s.name: SuiteRules(flaky_rate=s.quarantine_rate if s.quarantine_rate is not None
                               else AUTO_QUARANTINE_RATE, min_runs=s.quarantine_min_runs,
                               blocks=tuple(s.verdict_blocks)) for s in suites}


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    if args.commits < 1 or args.last_runs < 1:
        raise UsageError("--commits and --last-runs must be at least 1")
    root = args.root.resolve()
    url = resolve_url(args.history, os.environ, root)
    if url is None:
        raise UsageError("--history off: the HUD has no store to read")
    repo = args.repo if args.repo is not None else os.environ.get("GITHUB_REPOSITORY", "")
    if repo and (repo.count("/") != 1 or any(c.isspace() for c in repo)):
        raise UsageError(f"--repo {repo!r}: give OWNER/NAME")
    started = time.monotonic()
    suites = load_registry(root).suites
    entries = [(s, e) for s in suites for e in s.entries]
    gated = {e.id: tuple(dict.fromkeys(g.metric for g in e.gates)) for _s, e in entries if e.gates}
    with open_store(url, create=False) as store:  # a page never makes a store
        history = read(store, branch=args.branch, last_runs=args.last_runs, include_prs=args.include_prs,
                       gated=gated)
        lifts = store.lifts()
    settings = Settings(branch=args.branch, commits=args.commits, repo=repo, rules=_rules(suites),
                        held={(s.name, e.id): e.quarantine for s, e in entries if e.quarantine},
                        quarantine={s.name: (s.quarantine_rate, s.quarantine_min_runs,
                                             s.quarantine_clean_runs) for s in suites},
                        quarantine_default=(AUTO_QUARANTINE_RATE, AUTO_QUARANTINE_MIN_RUNS,
                                            AUTO_QUARANTINE_CLEAN_RUNS),
                        lifts=lifts, suite_order=[s.name for s in suites], generated=time.time())
    built = write(render(history, settings), args.out)
    print(f"hud: {built.pages} pages in {built.folder} ({built.cells} cells, index.html "
          f"{built.bytes_main / 1024:.0f} KiB) from {len(history.main)} attempts in "
          f"{time.monotonic() - started:.1f} s")
    return EXIT_OK
