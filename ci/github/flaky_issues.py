"""`python -m ci issues`: one GitHub issue per quarantined entry and per entry failing on main.

The scheduled monitor job runs it. Nothing is held without an issue that says so: every entry
the quarantine holds (its flake rate, `ci.history.stats.auto_quarantine`, or the registry's
`Entry.quarantine`) gets an issue naming its owner (`Entry.owner`, else `Suite.owner`, else
CODEOWNERS), its rate and its last failures; every entry failing run after run on main gets
one with the range to bisect. An issue is found again by its marker,

    <!-- slime-ci:entry=<entry id> kind=<flaky|broken-main|selection-leak> -->

and the `slime-ci` label, so each entry has one issue per kind, whatever its title becomes.
A flaky issue closes itself once the entry's last `quarantine_clean_runs` runs all passed at
the first try (the quarantine lets it go then too); a broken-main issue once main passes it
again. A closed issue reopens when the entry flakes or breaks again after it was closed. The
selection-leak issues are `python -m ci select-audit --issues`'s (ci/quality/leak_issues.py):
this command leaves them as they are.

Everything a test wrote (the reasons of its failures) is quoted inert, bodies are cut to
GitHub's limit with a line saying so, an entry that two suites hold gets one issue naming
both, and a run opens at most `--max-new` issues (the rest wait for the next run). Only the
bot's own issues are read back (`--author`): a marker pasted into someone else's issue is
no issue of the monitor's. One change that GitHub refuses is reported and the others are
still made.

Exit codes: 0 done (or nothing to do), 1 GitHub refused some change (each said in one line),
2 bad input, 4 the history store cannot be used (`--unreachable-ok`: one line and 0).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Literal, NoReturn, cast

from ci.errors import EXIT_FAILED, EXIT_OK, StoreError, UsageError
from ci.github.inert_text import BODY_LIMIT, TITLE_LIMIT, code, fit, plain, run_link
from ci.github.issue_kinds import MARKER_RE, WORDS, IssueKind, Wanted, codeowners, marker, owner_of
from ci.github.rest_client import GitHub, GitHubError
from ci.history.bisects import BisectRow, bisects
from ci.history.stats import after_lifts, auto_quarantine, clean_tail, flakiness, streaks
from ci.history.store import HISTORY_ENV, HISTORY_FILE, AttemptRow, open_store, resolve_url
from ci.history.verdicts import OK, infra_cause, short, when
from ci.registry.loader import load_registry
from ci.registry.model import Suite

LABEL = "slime-ci"
# Added to the body when the monitor closes an issue: one closed without it was closed by hand.
CLOSED_MARK = "<!-- slime-ci:closed-by-monitor -->"
STREAK_RUNS = 3  # as the monitor: failing this many runs in a row on main
HISTORY_RUNS = 500
LAST_FAILURES = 5
# Issues opened (or reopened) in one run at most: a history with 200 crafted entry names is
# 200 issues at once otherwise. The rest are opened by the next runs.
MAX_NEW = 10
BOT_LOGIN = "github-actions[bot]"  # who the monitor job's GITHUB_TOKEN writes as
FLAKY_TITLE = "Flaky: "  # how a flaky entry's issue title begins (the HUD searches by it)


# --- what should be tracked -------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Existing:
    """An issue the label and marker found."""

    number: int
    entry_id: str
    kind: IssueKind
    state: str
    closed_at: float | None
    body: str = ""
    title: str = ""

    @property
    def closed_by_hand(self) -> bool:
        return self.state == "closed" and CLOSED_MARK not in self.body


@dataclass(frozen=True, kw_only=True)
class Action:
    """One thing to do on GitHub, and why."""

    verb: Literal["open", "update", "close", "reopen", "keep", "lift", "wait"]
    entry_id: str
    kind: IssueKind
    number: int | None
    why: str
    wanted: Wanted | None = None
    body: str = ""  # the issue's body as it is (a close keeps it, with CLOSED_MARK added)


_SHA = re.compile(r"[0-9a-f]{7,64}")


def _links(server: str, repo: str, rows: Sequence[AttemptRow]) -> list[str]:
    out = []
    for r in rows[-LAST_FAILURES:]:
        sha = r.commit if _SHA.fullmatch(r.commit) else ""
        commit = f"[{short(sha)}]({server}/{repo}/commit/{sha})" if sha and repo else \
            code(short(r.commit), table=False)
        ran = run_link(server, repo, r.gh_run_id, r.gh_run_attempt, r.gh_job)
        out.append(f"- {when(r.started_at)} on {code(r.branch or '?', 80, table=False)} at {commit}"
                   + (f" ({ran})" if ran else "") + ": "
                   + code(f"{r.outcome}: {r.reason}" if r.reason else r.outcome, table=False))
    return out


def _culprit(server: str, repo: str, answer: BisectRow) -> str:
    """The bisect's word on the streak: the commit it found, linked, else its one-line answer."""
    sha = answer.commit if _SHA.fullmatch(answer.commit) else ""
    if answer.kind == "first-bad" and sha:
        linked = f"[{short(sha)}]({server}/{repo}/commit/{sha})" if repo else code(short(sha), table=False)
        return f"- **culprit**: {linked}, found by `python -m ci bisect` ({when(answer.started_at)}): " + \
            code(answer.summary, 400, table=False)
    return f"- bisect ({when(answer.started_at)}): " + code(answer.summary, 400, table=False)


def wanted_issues(rows: Sequence[AttemptRow], suites: Sequence[Suite], root: Path, *, repo: str,
                  server: str = "https://github.com", k: int = STREAK_RUNS,
                  lifts: Mapping[tuple[str, str], float] | None = None,
                  bisects: Sequence[BisectRow] = ()) -> list[Wanted]:
    """The issues the trusted history calls for: one per held entry, one per entry failing on main.

    `bisects`: the store's bisect answers; a broken-main issue names the commit one found, of
    an answer whose bad end is a failing run of its streak."""
    rules = codeowners(root)
    out: list[Wanted] = []
    trusted = [r for r in rows if r.trusted]
    for suite in suites:
        mine = [r for r in trusted if r.suite == suite.name]
        entries = {e.id: e for e in suite.entries}
        held: dict[str, str] = {}
        if suite.quarantine_rate is not None:
            counted = after_lifts(mine, lifts or {})  # as the run's quarantine counts them
            held = auto_quarantine(flakiness(counted), rate=suite.quarantine_rate,
                                   min_runs=suite.quarantine_min_runs)
            tail = clean_tail(counted)
            held = {e: why for e, why in held.items() if tail.get(e, 0) < suite.quarantine_clean_runs}
        held.update({e: f"quarantined in the registry: {x.quarantine}"
                     for e, x in entries.items() if x.quarantine})
        for entry_id, why in sorted(held.items()):
            e = entries.get(entry_id)
            path = e.path if e is not None else entry_id.split(" ", 1)[0]
            owner = owner_of(path, e.owner if e else "", suite.owner, rules)
            bad = [r for r in mine if r.entry_id == entry_id and r.outcome not in ("passed", "deselected")
                   and (r.final or r.outcome not in OK)]
            body = "\n".join([
                marker(entry_id, "flaky"),
                f"{code(entry_id, 300, table=False)} (suite `{suite.name}`) is **quarantined**: it still "
                "runs on every job, "
                "but its failures do not fail them.", "",
                f"- why: {code(why, 400, table=False)}",
                f"- owner: {owner or 'nobody named (set Entry.owner, Suite.owner or CODEOWNERS)'}",
                f"- closes itself after {suite.quarantine_clean_runs} runs in a row that pass at the "
                "first try, and the quarantine lets the entry go then", "",
                "Its last failures:", *(_links(server, repo, bad) or ["- none recorded"]), "",
                f"Reproduce: {code(f'nox -s {suite.name} -- --only {path}', 400, table=False)}; the rate: "
                f"`python -m ci history flaky --suite {suite.name}`.",
            ])
            out.append(Wanted(entry_id=entry_id, kind="flaky", owner=owner, body=body, suites=(suite.name,),
                              title=f"{FLAKY_TITLE}{plain(entry_id, 200)} ({suite.name})",
                              since=max((r.started_at for r in bad), default=0.0),
                              by_registry=bool(e is not None and e.quarantine)))
        for s in streaks([r for r in mine if infra_cause(r) is None], branch="main", k=k):
            e = entries.get(s.entry_id)
            path = e.path if e is not None else s.entry_id.split(" ", 1)[0]
            owner = owner_of(path, e.owner if e else "", suite.owner, rules)
            fails = [r for r in mine if r.entry_id == s.entry_id and r.final and r.branch == "main"
                     and r.started_at >= s.since]
            good = s.last_passing_commit
            failing = {r.commit for r in fails}
            answer = next((b for b in reversed(bisects) if b.entry_id == s.entry_id and b.bad in failing),
                          None)
            body = "\n".join([
                marker(s.entry_id, "broken-main"),
                f"{code(s.entry_id, 300, table=False)} (suite `{suite.name}`) has failed its last "
                f"{s.failures} runs on `main`.", "",
                f"- owner: {owner or 'nobody named (set Entry.owner, Suite.owner or CODEOWNERS)'}",
                f"- first failing commit: {code(s.first_failing_commit, 64, table=False)} ({when(s.since)})",
                f"- range to bisect: {code(f'{good}..{s.first_failing_commit}', 140, table=False)}" if good
                else "- no passing run of it on main is recorded",
                *([_culprit(server, repo, answer)] if answer is not None else []),
                "- why: " + code("; ".join(s.reasons), 600, table=False), "",
                "Its failures:", *_links(server, repo, fails), "",
                "This issue closes itself when main passes it again.",
            ])
            out.append(Wanted(entry_id=s.entry_id, kind="broken-main", owner=owner, body=body,
                              suites=(suite.name,), since=s.since,
                              title=f"Failing on main: {plain(s.entry_id, 200)} ({suite.name})"))
    return merged(out)


def merged(wanted: Sequence[Wanted]) -> list[Wanted]:
    """One issue per entry and kind: an entry that two suites run (or hold) gets one issue with a
    section per suite, never two issues behind one marker (one orphaned, one rewritten twice)."""
    by_key: dict[tuple[str, IssueKind], list[Wanted]] = {}
    for w in wanted:
        by_key.setdefault((w.entry_id, w.kind), []).append(w)
    out = []
    for (entry_id, kind), group in by_key.items():
        if len(group) == 1:
            out.append(_bounded(group[0]))
            continue
        suites = tuple(x for w in group for x in w.suites)
        first, *rest = group
        lead = WORDS[kind][0]
        body = "\n\n---\n\n".join([first.body, *(w.body.split("\n", 1)[1] for w in rest)])  # one marker
        owners = " ".join(dict.fromkeys(o for w in group for o in w.owner.split()))
        out.append(Wanted(entry_id=entry_id, kind=kind, body=body, owner=owners, suites=suites,
                          title=f"{lead}: {plain(entry_id, 200)} ({', '.join(suites)})",
                          since=max(w.since for w in group), by_registry=any(w.by_registry for w in group)))
        out[-1] = _bounded(out[-1])
    return out


def _bounded(w: Wanted) -> Wanted:
    """Within GitHub's limits: an oversize body was refused, and every later change with it."""
    where = "`python -m ci issues --dry-run` and `python -m ci history show` show the rest."
    return replace(w, title=w.title[:TITLE_LIMIT], body=fit(w.body, limit=BODY_LIMIT, where=where))


def _closed_at(raw: object) -> float | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _login(item: Mapping[str, object]) -> str:
    user = item.get("user")
    login = user.get("login") if isinstance(user, dict) else None
    return login if isinstance(login, str) else ""


def existing_issues(items: Sequence[object], author: str = BOT_LOGIN) -> list[Existing]:
    """The issues (open or closed) that `author` opened and whose body starts with a marker;
    pull requests, and anyone else's issue that quotes a marker, are left out."""
    out = []
    for i in items:
        if not isinstance(i, dict) or "pull_request" in i or _login(i).casefold() != author.casefold():
            continue
        found = MARKER_RE.match(str(i.get("body") or ""))
        number = i.get("number")
        if found and isinstance(number, int):
            kind = cast(IssueKind, found.group(2))
            out.append(Existing(number=number, entry_id=urllib.parse.unquote(found.group(1)), kind=kind,
                                state=str(i.get("state", "open")), closed_at=_closed_at(i.get("closed_at")),
                                body=str(i.get("body") or ""), title=str(i.get("title") or "")))
    return out


def plan(wanted: Sequence[Wanted], existing: Sequence[Existing], rows: Sequence[AttemptRow],
         suites: Sequence[Suite], *, max_new: int = MAX_NEW, audited: bool = False) -> list[Action]:
    """What to do: open what is missing, reopen what came back, close what recovered; at most
    `max_new` opened or reopened (the rest `wait`), an unchanged issue left as it is.
    `audited`: the leak audit ran, so a selection-leak issue it no longer calls for closes."""
    by_key: dict[tuple[str, IssueKind], Existing] = {}
    actions: list[Action] = []
    # One issue per key: the oldest open one, else the oldest. Another open one behind the
    # same key (left by an earlier release) is closed as its duplicate, never orphaned.
    for issue in sorted(existing, key=lambda i: (i.state != "open", i.number)):
        kept = by_key.setdefault((issue.entry_id, issue.kind), issue)
        if kept is not issue and issue.state == "open":
            actions.append(Action(verb="close", entry_id=issue.entry_id, kind=issue.kind, number=issue.number,
                                  body=issue.body, why=f"a duplicate of #{kept.number}"))
    opened = 0
    for w in wanted:
        x = by_key.get((w.entry_id, w.kind))
        new = x is None or (x.state != "open" and x.closed_at is not None and w.since > x.closed_at)
        if new and opened >= max_new:
            actions.append(Action(verb="wait", entry_id=w.entry_id, kind=w.kind,
                                  number=x.number if x else None, wanted=w,
                                  why=f"{max_new} issues opened this run already; the next run"))
            continue
        opened += new
        if x is None:
            actions.append(Action(verb="open", entry_id=w.entry_id, kind=w.kind, number=None, wanted=w,
                                  why=WORDS[w.kind][1]))
        elif x.state == "open":
            if (x.title, x.body) != (w.title, w.body):
                why = WORDS[w.kind][2]
                actions.append(Action(verb="update", entry_id=w.entry_id, kind=w.kind, number=x.number,
                                      wanted=w, why=why))
        elif x.closed_at is not None and w.since > x.closed_at:
            actions.append(Action(verb="reopen", entry_id=w.entry_id, kind=w.kind, number=x.number, wanted=w,
                                  why=f"{WORDS[w.kind][3]} again "
                                      f"on {when(w.since)}, after the issue was closed"))
        elif w.kind == "flaky" and x.closed_by_hand and x.closed_at is not None and not w.by_registry:
            # A person closed it: the entry is trusted again. Its flakes before then are
            # forgotten (the store keeps the lift), so the quarantine lets it go.
            actions.append(Action(verb="lift", entry_id=w.entry_id, kind=w.kind, number=x.number, wanted=w,
                                  why=f"#{x.number} was closed by hand on {when(x.closed_at)}: the "
                                      "quarantine is lifted, its flakes before then forgotten"))
    want = {(w.entry_id, w.kind) for w in wanted}
    trusted = [r for r in rows if r.trusted]
    tail = clean_tail(trusted)
    clean_runs = {e.id: s.quarantine_clean_runs for s in suites for e in s.entries}
    for x in by_key.values():
        if x.state != "open" or (x.entry_id, x.kind) in want:
            continue
        if x.kind == "selection-leak":
            if audited:
                actions.append(Action(verb="close", entry_id=x.entry_id, kind=x.kind, number=x.number,
                                      body=x.body, why="the leak audit selects it again for every "
                                                       "known failure it caught"))
        elif x.kind == "flaky":
            n = clean_runs.get(x.entry_id, 10)
            if tail.get(x.entry_id, 0) >= n:
                actions.append(Action(verb="close", entry_id=x.entry_id, kind=x.kind, number=x.number,
                                      body=x.body,
                                      why=f"its last {tail[x.entry_id]} runs passed at the first try "
                                          f"(needed {n}); the quarantine lets it go"))
            else:
                actions.append(Action(verb="keep", entry_id=x.entry_id, kind=x.kind, number=x.number,
                                      why=f"{tail.get(x.entry_id, 0)} of {n} clean runs so far"))
        else:
            last = [r for r in trusted if r.entry_id == x.entry_id and r.final and r.branch == "main"
                    and infra_cause(r) is None]
            if last and last[-1].outcome in OK:
                actions.append(Action(verb="close", entry_id=x.entry_id, kind=x.kind, number=x.number,
                                      body=x.body, why=f"main passed it again at {short(last[-1].commit)}"))
    return actions


def _carry_out(gh: GitHub, a: Action) -> str:
    w = a.wanted
    if a.verb == "open" and w is not None:
        body: dict[str, object] = {"title": w.title, "body": w.body, "labels": [LABEL]}
        users = [o.lstrip("@") for o in w.owner.split() if o.startswith("@") and "/" not in o]
        if users:
            body["assignees"] = users
        made = gh.call("POST", "/issues", body)
        number = made.get("number") if isinstance(made, dict) else "?"
        return f"opened #{number}: {w.title} ({a.why})"
    if a.verb in ("update", "reopen") and w is not None:
        change: dict[str, object] = {"title": w.title, "body": w.body}
        if a.verb == "reopen":
            change["state"] = "open"
            gh.call("POST", f"/issues/{a.number}/comments", {"body": f"Reopened: {a.why}."})
        gh.call("PATCH", f"/issues/{a.number}", change)
        return f"{'reopened' if a.verb == 'reopen' else 'updated'} #{a.number}: {a.entry_id} ({a.why})"
    if a.verb == "close":
        gh.call("POST", f"/issues/{a.number}/comments", {"body": f"Closing: {a.why}."})
        kept = fit(a.body, limit=BODY_LIMIT - len(CLOSED_MARK) - 1)  # the mark must survive the cut
        gh.call("PATCH", f"/issues/{a.number}", {"state": "closed", "state_reason": "completed",
                                                 "body": f"{kept}\n{CLOSED_MARK}"})
        return f"closed #{a.number}: {a.entry_id} ({a.why})"
    if a.verb == "lift":
        return f"lifted the quarantine of {a.entry_id} ({a.why})"
    if a.verb == "wait":
        return f"left {a.kind} {a.entry_id} for a later run ({a.why})"
    return f"kept #{a.number} open: {a.entry_id} ({a.why})"


def apply(gh: GitHub, actions: Sequence[Action]) -> tuple[list[str], list[str]]:
    """Carry the actions out: (one line per change made, one line per change GitHub refused).
    A refusal is that action's alone: the others are still made."""
    done, refused = [], []
    for a in actions:
        try:
            done.append(_carry_out(gh, a))
        except GitHubError as exc:
            hint = "; the job needs `issues: write`" if exc.status in (401, 403) else ""
            refused.append(f"could not {a.verb} {'#' + str(a.number) if a.number else 'an issue'} "
                           f"({a.kind} {a.entry_id[:120]}): {exc}{hint}")
    return done, refused


def listed(gh: GitHub, author: str) -> list[Existing]:
    """The monitor's issues on GitHub, open and closed (`existing_issues`); a refusal is a
    UsageError that says what the job needs."""
    try:
        return existing_issues(gh.pages(f"/issues?labels={LABEL}&state=all"), author)
    except GitHubError as exc:
        hint = "; the job needs `issues: write`" if exc.status in (401, 403) else ""
        raise UsageError(f"cannot list the {LABEL} issues: {exc}{hint}") from None


def say_planned(actions: Sequence[Action], prog: str) -> None:
    """`--dry-run`: each action, then how many, none taken."""
    for a in actions:
        print(f"would {a.verb} {'#' + str(a.number) if a.number else 'an issue'}: "
              f"{a.kind} {a.entry_id} ({a.why})")
    print(f"{prog}: {len(actions)} action(s), none taken (--dry-run)")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `python -m ci issues --help`)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m ci issues", allow_abbrev=False,
                description="Open, update, close and reopen one GitHub issue per quarantined entry and per "
                            "entry failing on main, from the trusted run history (the monitor job runs it).",
                epilog="Exit codes: 0 done, 2 bad input, 4 the history store cannot be used.")
    p.add_argument("--history", metavar="URL",
                   help=f"store URL (default: {HISTORY_ENV}, else {HISTORY_FILE})")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: .)")
    p.add_argument("--repo", metavar="OWNER/NAME", help="the repository (default: GITHUB_REPOSITORY)")
    p.add_argument("-k", type=int, default=STREAK_RUNS,
                   help=f"failures in a row on main that open a broken-main issue (default: {STREAK_RUNS})")
    p.add_argument("--max-new", type=int, default=MAX_NEW,
                   help=f"issues opened or reopened in one run at most (default: {MAX_NEW}); the rest wait")
    p.add_argument("--author", metavar="LOGIN", default=BOT_LOGIN,
                   help=f"the login the token writes as: only its issues are read back "
                        f"(default: {BOT_LOGIN})")
    p.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing on GitHub")
    p.add_argument("--unreachable-ok", action="store_true",
                   help="no GITHUB_TOKEN, or a store that cannot be used: one line and exit 0 "
                        "(the scheduled job's mode; `nox -s monitor` on a laptop)")
    return p


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    if args.k < 1:
        raise UsageError("-k must be at least 1")
    if args.max_new < 0:
        raise UsageError("--max-new must be 0 or more")
    root = args.root.resolve()
    url = resolve_url(args.history, os.environ, root)
    if url is None:
        raise UsageError("--history off: there is no store to read")
    registry = load_registry(root)
    if args.unreachable_ok and not args.dry_run and not os.environ.get("GITHUB_TOKEN", "").strip():
        print("issues: skipped, no GITHUB_TOKEN (the monitor job's token opens the issues)", file=sys.stderr)
        return EXIT_OK
    gh = None if args.dry_run else GitHub.from_env(os.environ, args.repo)
    repo = gh.repo if gh is not None else (args.repo or os.environ.get("GITHUB_REPOSITORY", ""))
    try:
        with open_store(url) as store:
            rows = store.attempts(trusted_only=True, last_runs=HISTORY_RUNS)
            lifts = store.lifts()
            answers = bisects(store)
    except StoreError as exc:
        if args.unreachable_ok:
            print(f"issues: skipped, the history store cannot be used ({exc})", file=sys.stderr)
            return EXIT_OK
        raise
    wanted = wanted_issues(rows, registry.suites, root, repo=repo, k=args.k, lifts=lifts, bisects=answers,
                           server=os.environ.get("GITHUB_SERVER_URL", "https://github.com"))
    existing = listed(gh, args.author) if gh is not None else []
    actions = plan(wanted, existing, rows, registry.suites, max_new=args.max_new)
    if gh is None:
        say_planned(actions, "issues")
        return EXIT_OK
    lifting = [a for a in actions if a.verb == "lift" and a.wanted is not None]
    if lifting:
        # The store learns first: a lift that GitHub's side never hears of still lets the entry go.
        with open_store(url) as store:
            for a in lifting:
                closed = next(x.closed_at for x in existing if x.number == a.number)
                for suite in a.wanted.suites if a.wanted else ():
                    store.lift(suite=suite, entry_id=a.entry_id, at=closed or 0.0, why=a.why)
    done, refused = apply(gh, actions)
    for line in done:
        print(line)
    for line in refused:
        print(f"error: {line}", file=sys.stderr)
    print(f"issues: {len(wanted)} entr{'y' if len(wanted) == 1 else 'ies'} tracked, "
          f"{sum(a.verb not in ('keep', 'wait') for a in actions) - len(refused)} change(s)"
          + (f", {len(refused)} refused by GitHub" if refused else ""))
    return EXIT_FAILED if refused else EXIT_OK

