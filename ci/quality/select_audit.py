"""`python -m ci select-audit`: would selection by executed code have run the entry that caught each break?

Two kinds of known failure are replayed. Every planted break under tests/e2e/plants/: its
patch is the diff and the entries its `only:` names are the ones that catch it. And every
commit of main that a bisect blamed for an entry's failure (the history's `bisects`, a
first-bad or rate-rose answer): the commit's diff against its first parent, and the
entry that failed. For each, the selection (`ci.select.by_execution`, on the history's
newest trusted records, then the checkout's records file) must pick one of those entries;
a CPU suite always runs every entry. A blamed commit this checkout does not hold (a
shallow clone), or whose entry is no longer registered, is named and left out. The table
gives each case's verdict and the entries selected of its suite, then the recall of each
kind and the GPU-seconds selected against all entries of the suites (measured durations,
else the committed baseline). Exit 1 when either recall is below the registry's
(`SelectionPolicy.recall`, default 1.0). With `--issues` (the monitor job) it keeps one
GitHub issue per missed entry instead (ci/quality/leak_issues.py), and the exit code says
whether GitHub took every change. The cases themselves: ci/quality/audit_cases.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ci.args import existing_dir
from ci.errors import EXIT_FAILED, EXIT_OK, UsageError
from ci.quality.audit_cases import BLAMED, PLANT, Case, recall, run_audit
from ci.registry.loader import load_registry
from ci.select import executed


def report(cases: Sequence[Case], recall_goal: float, unrecorded: int, entries: int) -> tuple[str, bool]:
    """The table and closing lines; whether the recall of each kind reaches the goal."""
    rows = [("case", "suite", "selected", "entries", "reason")]
    rows += [(c.plant, c.suite, "yes" if c.selected else "MISSED", f"{c.picked} of {c.total}", c.why)
             for c in cases]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows]
    lines.append("")
    ok = True
    for kind, plural in ((PLANT, "plants"), (BLAMED, "blamed commits")):
        mine = [c for c in cases if c.kind == kind]
        if kind == BLAMED and not mine:
            lines.append("no blamed commit to replay (the history holds no bisect answer naming one)")
            continue
        got = recall(mine)
        ok = ok and got >= recall_goal
        lines.append(f"recall {got:.2f} ({sum(c.selected for c in mine)} of {len(mine)} {plural}; "
                     f"the registry asks {recall_goal:.2f})")
    picked, total = sum(c.gpu_seconds for c in cases), sum(c.gpu_seconds_all for c in cases)
    ratio = f"{picked / total:.2f}" if total else "n/a"
    lines.append(f"GPU-seconds selected / all entries of their suites: {picked:.0f} / {total:.0f} = {ratio}")
    if unrecorded:
        lines.append(f"{unrecorded} of {entries} GPU entries have no record and always run: record "
                     "them with `python -m ci run --suite <suite> --record-executed`")
    return "\n".join(lines), ok


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ci select-audit",
                                description="replay every planted break, and every commit of main a bisect "
                                            "blamed, against selection by executed code; exit 1 "
                                            "below the registry's recall")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: here)")
    p.add_argument("--records", type=Path, default=None,
                   help=f"read the records from this file alone (default: the history's newest "
                        f"trusted record per entry, then <root>/{executed.RECORDS_FILE})")
    p.add_argument("--history", metavar="URL", default=None,
                   help="the run-history store to read records and bisect answers from (default: "
                        "SLIME_CI_HISTORY_URL, else the checkout's store; `off`: the records file "
                        "alone, no blamed commits)")
    p.add_argument("--issues", action="store_true",
                   help="keep one GitHub issue per entry whose catch the selection would miss, and "
                        "close it once the audit selects the entry again (the monitor job's mode); the "
                        "exit code then says whether GitHub took every change, not the recall")
    p.add_argument("--repo", metavar="OWNER/NAME", help="with --issues: the repository (default: "
                                                         "GITHUB_REPOSITORY)")
    p.add_argument("--dry-run", action="store_true", help="with --issues: say what would be done; "
                                                           "change nothing on GitHub")
    p.add_argument("--unreachable-ok", action="store_true",
                   help="with --issues: no GITHUB_TOKEN is one line and exit 0 (a laptop)")
    return p


def main(argv: Sequence[str]) -> int:
    """Replay, print the table, exit by the recall."""
    from ci.history.store import resolve_url

    args = build_parser().parse_args(list(argv))
    if (args.dry_run or args.unreachable_ok or args.repo) and not args.issues:
        raise UsageError("--dry-run, --unreachable-ok and --repo go with --issues")
    root = existing_dir("--root", args.root)
    registry = load_registry(root)

    def warn(message: str) -> None:
        print(f"warning: {message}", file=sys.stderr)

    audit = run_audit(root, registry, resolve_url(args.history, os.environ, root), warn,
                      records_file=args.records)
    text, ok = report(audit.cases, registry.selection.recall, audit.unrecorded, audit.entries)
    print(text)
    if args.issues:
        from ci.quality.leak_issues import keep_issues

        return keep_issues(audit, registry, root, repo=args.repo, dry_run=args.dry_run,
                           unreachable_ok=args.unreachable_ok)
    return EXIT_OK if ok else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
