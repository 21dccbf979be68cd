"""`python -m ci select-audit --issues`: one GitHub issue per entry whose catch the selection would miss.

The monitor job runs the leak audit (`ci.quality.select_audit`) on the checkout and the
store's records: every planted break and every commit a bisect blamed. Each entry that
caught one of them but that the selection by executed code would not have run gets an
issue (kind `selection-leak`, found again by its marker as the monitor's other issues are,
ci/github/flaky_issues.py) naming the cases, the reason the selection gave, and what to
do; it closes itself once an audit selects the entry for every case. The issue's time is
the newest record's, so an issue closed by hand reopens only when a newer recording still
misses.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ci.errors import EXIT_FAILED, EXIT_OK
from ci.github.flaky_issues import BOT_LOGIN, MAX_NEW, apply, listed, merged, plan, say_planned
from ci.github.inert_text import code, plain
from ci.github.issue_kinds import WORDS, Wanted, codeowners, marker, owner_of
from ci.github.rest_client import GitHub
from ci.quality.audit_cases import BLAMED, Audit, Case
from ci.registry.loader import Registry


def leak_issues(audit: Audit, registry: Registry, root: Path) -> list[Wanted]:
    """One issue per entry of a missed case (its first catcher), listing every case it missed."""
    by_entry: dict[str, list[Case]] = {}
    for case in audit.missed():
        by_entry.setdefault(case.catchers[0], []).append(case)
    rules = codeowners(root)
    out = []
    for entry_id, cases in sorted(by_entry.items()):
        suite = registry[cases[0].suite]
        entry = next((e for e in suite.entries if e.id == entry_id), None)
        path = entry.path if entry is not None else entry_id.split(" ", 1)[0]
        owner = owner_of(path, entry.owner if entry else "", suite.owner, rules)
        lines = [f"- {'blamed commit' if c.kind == BLAMED else 'plant'} {code(c.plant, 200, table=False)}: "
                 f"{code(c.why, 300, table=False)} ({c.picked} of {c.total} entries selected)" for c in cases]
        body = "\n".join([
            marker(entry_id, "selection-leak"),
            f"{code(entry_id, 300, table=False)} (suite `{suite.name}`) caught a known failure that "
            "selection by executed code would **not** run it for: a PR with that change would pass "
            "its GPU job without this entry.", "",
            *lines, "",
            f"- owner: {owner or 'nobody named (set Entry.owner, Suite.owner or CODEOWNERS)'}",
            "- what to do: record the entry again (`python -m ci run --suite "
            f"{suite.name} --only {path} --emulate-gpus --record-executed`); if it still misses, the "
            "changed file acts without being executed as code: add it to "
            "`SelectionPolicy.leak_paths` in the registry.", "",
            "Reproduce: `python -m ci select-audit`. This issue closes itself when the audit "
            "selects the entry again.",
        ])
        out.append(Wanted(entry_id=entry_id, kind="selection-leak", owner=owner, body=body,
                          suites=(suite.name,), since=audit.recorded_at,
                          title=f"{WORDS['selection-leak'][0]}: {plain(entry_id, 200)} ({suite.name})"))
    return out


def missed_summary(cases: Sequence[Case]) -> str:
    """One line for the job log: how many cases were missed, of how many."""
    missed = sum(not c.selected for c in cases)
    return f"leak audit: {missed} of {len(cases)} known failure(s) missed by the selection"


def keep_issues(audit: Audit, registry: Registry, root: Path, *, repo: str | None = None,
                author: str = BOT_LOGIN, max_new: int = MAX_NEW, dry_run: bool = False,
                unreachable_ok: bool = False) -> int:
    """Open, update, close or reopen the selection-leak issues the audit calls for.

    Exit code: 0 done (or, with `unreachable_ok`, no GITHUB_TOKEN: one line), 1 GitHub refused
    a change (each said in one line)."""
    if unreachable_ok and not dry_run and not os.environ.get("GITHUB_TOKEN", "").strip():
        print("select-audit: issues skipped, no GITHUB_TOKEN (the monitor job's token opens them)",
              file=sys.stderr)
        return EXIT_OK
    wanted = merged(leak_issues(audit, registry, root))
    gh = None if dry_run else GitHub.from_env(os.environ, repo)
    existing = [x for x in listed(gh, author) if x.kind == "selection-leak"] if gh is not None else []
    actions = plan(wanted, existing, (), registry.suites, max_new=max_new, audited=True)
    if gh is None:
        say_planned(actions, "select-audit")
        return EXIT_OK
    done, refused = apply(gh, actions)
    for line in done:
        print(line)
    for line in refused:
        print(f"error: {line}", file=sys.stderr)
    return EXIT_FAILED if refused else EXIT_OK
