"""`python -m ci why`: the verdict of every entry a PR's run did not pass, as a table, a sticky
PR comment and the `verdict` merge gate.

The rules are `ci.history.verdicts.RULES`; this module reads the history, renders the tables
(one per suite: entry, verdict, evidence, the command that reproduces it) and, in CI, keeps
one comment on the PR up to date: it finds its own comment (the bot's, starting with
`MARKER`) and edits it, so a PR gets one comment however often it is pushed. What a test
wrote is quoted inert and the body cut to GitHub's limit (ci.github.inert_text). `--gate`
exits 1 when a verdict that its suite says blocks (`Suite.verdict_blocks`: new and unknown
by default) is among them, or a job of `--needs` did not succeed (ci.github.job_verdicts).

Exit codes: 0 nothing blocks, 1 a blocking verdict (--gate), 2 bad input, 4 the history
store cannot be used.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import NoReturn

from ci.errors import EXIT_FAILED, EXIT_OK, StoreError, UsageError
from ci.github.check_runs import CheckRun, build, links_line, publish, read_junit
from ci.github.inert_text import code, fit, run_link
from ci.github.job_verdicts import endings, judge_jobs, parse_needs, planned_shards
from ci.github.rest_client import GitHub, GitHubError, pr_number
from ci.github.why_last import baseline_url, local_url, read_last
from ci.history.store import HISTORY_ENV, HISTORY_FILE, AttemptRow, open_store, resolve_url
from ci.history.verdicts import (
    KINDS,
    LABELS,
    RULES,
    Base,
    SuiteRules,
    Verdict,
    base_of,
    blocking,
    head_rows,
    judge,
)
from ci.log import Log
from ci.registry.loader import load_registry
from ci.registry.model import AUTO_QUARANTINE_RATE, Suite

MARKER = "<!-- slime-ci:verdicts -->"
DEFAULT_SERVER = "https://github.com"  # GITHUB_SERVER_URL when unset (a laptop)
HISTORY_RUNS = 400  # the newest trusted runs of a suite read as its baseline
# Who writes the verdict comment: the workflow's GITHUB_TOKEN posts as this bot. Only its own
# comment is edited; a comment of anyone else that carries the marker is left alone.
BOT_LOGIN = "github-actions[bot]"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `python -m ci why --help`)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m ci why", allow_abbrev=False,
                description="Why did each entry of a PR's (or one run's) newest run not pass? A verdict per "
                            "entry (new, already failing on main, flaky, infrastructure, unknown) with its "
                            "evidence, from the run and the trusted history.",
                epilog="Exit codes: 0 nothing blocks, 1 a blocking verdict (with --gate), 2 bad input, "
                       "4 the history store cannot be used. docs/verdicts.md says what each verdict means.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--pr", type=pr_number, metavar="N",
                       help="judge pull request N (the newest commit of it the history holds)")
    which.add_argument("--run", metavar="ID", help="one recorded run (its uid, or a unique prefix)")
    which.add_argument("--last", action="store_true",
                       help="the last local run (in --history, else .ci-cache/history.sqlite), against "
                            f"main's trusted runs: from {HISTORY_ENV} (read only), else the snapshot "
                            "`python -m ci history pull` saved")
    p.add_argument("--base", metavar="SHA",
                   help="the PR's merge base: `new` needs a pass on main at or after it (default: "
                        "judged against main's latest runs, and the table says so)")
    p.add_argument("--suite", help="only this suite")
    p.add_argument("--branch", default="main", help="the trusted branch to compare with (default: main)")
    p.add_argument("--history", metavar="URL",
                   help=f"store URL (default: {HISTORY_ENV}, else {HISTORY_FILE})")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: .)")
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    p.add_argument("--gate", action="store_true",
                   help="exit 1 when a verdict blocks the merge (the CI `verdict` check)")
    p.add_argument("--comment", action="store_true",
                   help="create or update this PR's verdict comment (needs --pr, GITHUB_TOKEN, "
                        "GITHUB_REPOSITORY)")
    p.add_argument("--checks", action="store_true",
                   help="create one check run per suite, `slime-ci / SUITE`, with annotations at the "
                        "failed tests (needs GITHUB_TOKEN, GITHUB_REPOSITORY; --dry-run: print them)")
    p.add_argument("--head", metavar="SHA", help="with --checks: the commit the check runs are for "
                                                 "(default: the judged run's commit)")
    p.add_argument("--junit", metavar="DIR", type=Path,
                   help="with --checks: JUnit reports (searched below DIR) that place each annotation at "
                        "its test's assertion; without, at the test file's first line")
    p.add_argument("--dry-run", action="store_true",
                   help="with --comment or --checks: print what would be written, write nothing")
    p.add_argument("--repo", metavar="OWNER/NAME", help="the repository (default: GITHUB_REPOSITORY)")
    p.add_argument("--author", metavar="LOGIN", default=BOT_LOGIN,
                   help=f"with --comment: the login the token posts as; only its comment is edited "
                        f"(default: {BOT_LOGIN})")
    p.add_argument("--needs", metavar="JSON",
                   help="the run's jobs and results (Actions' toJSON(needs)): a job that did not succeed "
                        "and that no failed entry of its own explains (cancelled, skipped although the "
                        "plan named it, failed with nothing recorded) gets a blocking `unknown` verdict")
    return p


def suite_rules(suites: Sequence[Suite]) -> dict[str, SuiteRules]:
    """What each suite declares for its verdicts; unknown verdict names are a registry error."""
    out = {}
    for s in suites:
        bad = [k for k in s.verdict_blocks if k not in KINDS]
        if bad:
            raise UsageError(f"suite {s.name}: verdict_blocks names {bad[0]!r}; "
                             f"use some of {', '.join(KINDS)}")
        rate = s.quarantine_rate if s.quarantine_rate is not None else AUTO_QUARANTINE_RATE
        out[s.name] = SuiteRules(flaky_rate=rate, min_runs=s.quarantine_min_runs,
                                 blocks=tuple(s.verdict_blocks))
    return out


def reproduce(v: Verdict, suite: Suite | None) -> str:
    """What reproduces it: the local command, or the comment that reruns it on the PR."""
    only = f"'{v.entry_id}'" if " " in v.entry_id else v.entry_id
    if v.kind == "infrastructure":
        return "comment `/rerun-failed`"
    if v.rule.startswith("job-") or v.rule == "plan-unread":
        return "its log; comment `/rerun-failed`"
    if suite is not None and suite.needs_gpus:
        local = code(f"nox -s {v.suite} -- --emulate-gpus --only {only}")
        return f"{local}; comment {code(f'/rerun-test {v.path}')}"
    return code(f"nox -s {v.suite} -- --only {only}")


def table_row(v: Verdict, blocks: bool, suite: Suite | None, *, repo: str = "",
              server: str = DEFAULT_SERVER) -> str:
    """One verdict's row of a suite's table (the comment's and its check run's); its evidence
    links the Actions run and job that failed it, when the history holds them."""
    mark = f"**{v.label}** :x:" if blocks else v.label
    failed = f"{v.outcome}: {v.reason}" if v.reason else v.outcome
    ran = run_link(server, repo, v.gh_run_id, v.gh_run_attempt, v.gh_job)
    return (f"| {code(v.entry_id, 200)} | {mark} (rule {code(v.rule, 40)}) | {code(failed)}; "
            f"{code(v.evidence)}{'; ' + ran if ran else ''} | {reproduce(v, suite)} |")


def markdown(verdicts: Sequence[Verdict], blocked: Sequence[Verdict], *, title: str, note: str,
             suites: Mapping[str, Suite], rules: Mapping[str, SuiteRules], local: str = "",
             checks: str = "", repo: str = "", server: str = DEFAULT_SERVER) -> str:
    """The comment (and step summary): the gate's outcome, then one table per suite.

    Everything a test or a PR's run wrote (entry ids, reasons, the evidence that quotes them)
    is quoted inert (ci.github.inert_text), and the body is cut to GitHub's limit."""
    lines = [MARKER, f"### slime CI verdicts: {title}", ""]
    if not verdicts:
        lines.append(f"**verdict: pass.** {note or 'Every recorded entry passed.'}")
        return "\n".join(lines + (["", checks] if checks else [])) + "\n"
    counts = ", ".join(f"{sum(v.kind == k for v in verdicts)} {LABELS[k]}" for k in KINDS
                       if any(v.kind == k for v in verdicts))
    if blocked:
        lines.append(f"**verdict: fail.** {len(blocked)} of {len(verdicts)} failed entries block the merge "
                     f"({counts}).")
    else:
        lines.append(f"**verdict: pass.** {len(verdicts)} entries did not pass, none of them because of "
                     f"this PR as far as the history shows ({counts}).")
    if note:
        lines += ["", note]
    for suite in sorted({v.suite for v in verdicts}):
        blocks = ", ".join(rules[suite].blocks) if suite in rules else "new, unknown"
        lines += ["", f"#### {code(suite, 120, table=False)} (blocks on: {blocks})", "",
                  "| entry | verdict | evidence | reproduce |", "|---|---|---|---|"]
        ours = sorted((v for v in verdicts if v.suite == suite),
                      key=lambda v: (KINDS.index(v.kind), v.entry_id))
        lines += [table_row(v, v in blocked, suites.get(suite), repo=repo, server=server) for v in ours]
    if checks:
        lines += ["", checks]
    lines += ["", "<sub>Verdict rules: docs/verdicts.md; locally: `python -m ci why --pr N`.</sub>"]
    return fit("\n".join(lines) + "\n", where=local)


def text_table(verdicts: Sequence[Verdict], blocked: Sequence[Verdict]) -> str:
    if not verdicts:
        return "every recorded entry passed"
    out = []
    for v in sorted(verdicts, key=lambda v: (v.suite, KINDS.index(v.kind), v.entry_id)):
        flag = " (blocks)" if v in blocked else ""
        out.append(f"{v.suite}: {v.entry_id}: {v.label}{flag} [rule {v.rule}]")
        out.append(f"    {v.outcome}: {v.reason}" if v.reason else f"    {v.outcome}")
        out.append(f"    {v.evidence}")
    return "\n".join(out)


def _author(comment: Mapping[str, object]) -> str:
    user = comment.get("user")
    login = user.get("login") if isinstance(user, dict) else None
    return login if isinstance(login, str) else ""


def upsert_comment(gh: GitHub, pr: int, body: str, *, author: str = BOT_LOGIN) -> str:
    """Edit this PR's verdict comment (the first comment by `author` that starts with MARKER), or
    post it when there is none; what was done. Anyone can paste the marker: only the author counts."""
    for c in gh.pages(f"/issues/{pr}/comments"):
        if (isinstance(c, dict) and _author(c).casefold() == author.casefold()
                and str(c.get("body", "")).startswith(MARKER)):
            if c.get("body") == body:
                return f"comment {c.get('id')} unchanged"
            gh.call("PATCH", f"/issues/comments/{int(c['id'])}", {"body": body})
            return f"updated comment {c.get('id')}"
    made = gh.call("POST", f"/issues/{pr}/comments", {"body": body})
    return f"posted comment {made.get('id') if isinstance(made, dict) else '?'}"


def _git_time(root: Path, commit: str) -> float | None:
    try:
        out = subprocess.run(["git", "-C", str(root), "show", "-s", "--format=%ct", "--end-of-options",
                              commit, "--"],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.stdout.strip().splitlines()[:1]
    return float(first[0]) if out.returncode == 0 and first and first[0].isdigit() else None


def _judged(store_rows: list[AttemptRow], args: argparse.Namespace) -> list[AttemptRow]:
    rows = [r for r in store_rows if args.suite is None or r.suite == args.suite]
    if args.run is not None:
        uids = {r.run_uid for r in rows}
        if len(uids) > 1:
            raise UsageError(f"--run {args.run!r} matches {len(uids)} runs; give more of the uid")
        return rows
    return head_rows(rows)


# A merge base as git names a commit: never an option (`--output=FILE` made git write a file).
_REF = re.compile(r"[0-9A-Za-z][0-9A-Za-z._/^~@{}-]{0,255}")


def _read(url: str, args: argparse.Namespace, *, default_store: bool) -> tuple[list[AttemptRow],
                                                                                list[AttemptRow], str]:
    """(the judged rows, their suites' trusted history, a note) from the store, which is never
    created here: a mistyped path is an error, not an empty store that passes everything."""
    try:
        store = open_store(url, create=False)
    except StoreError:
        if not (default_store and args.needs):
            raise
        # The verdict job before any snapshot exists and with no GPU job exported: the jobs'
        # results still speak, and the comment says what was not read.
        return [], [], "No history store here yet: only the jobs' results were judged."
    with store:
        found = store.attempts(pr=args.pr, run_uid=args.run, last_runs=HISTORY_RUNS)
        if args.run is not None and not found:
            raise UsageError(f"no run {args.run!r} in the history; "
                             "`python -m ci history show` lists the last ones")
        judged = _judged(found, args)
        names = sorted({r.suite for r in judged})
        history = [r for s in names
                   for r in store.attempts(suite=s, trusted_only=True, last_runs=HISTORY_RUNS)]
    return judged, history, ""


def _endings(gh: GitHub, env: Mapping[str, str], needs: Mapping[str, object]) -> dict[str, str]:
    """How each job of this workflow run that did not succeed ended, from the Actions API (the
    job token's `actions: read`); {} outside a workflow run or when GitHub does not answer."""
    run_id, attempt = env.get("GITHUB_RUN_ID", ""), env.get("GITHUB_RUN_ATTEMPT", "1") or "1"
    if not (run_id.isdigit() and attempt.isdigit()):
        return {}
    try:
        answer = gh.call("GET", f"/actions/runs/{run_id}/attempts/{attempt}/jobs?per_page=100")
    except GitHubError as exc:
        print(f"warning: how the jobs ended was not read ({exc})", file=sys.stderr)
        return {}
    items = answer.get("jobs") if isinstance(answer, dict) else None
    from ci.github.job_plan import PLAN_JOB, SHARDS_OUTPUT

    planned = planned_shards(needs, PLAN_JOB, SHARDS_OUTPUT)
    return endings(items, set(needs), planned) if isinstance(items, list) else {}


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    if args.comment and args.pr is None:
        raise UsageError("--comment needs --pr N (the pull request to comment on)")
    if args.base is not None and not _REF.fullmatch(args.base):
        raise UsageError(f"--base {args.base[:80]!r}: name the merge base by its commit SHA")
    needs = parse_needs(args.needs) if args.needs else None
    root = args.root.resolve()
    url = resolve_url(args.history, os.environ, root)
    if url is None:
        raise UsageError("--history off: there is no store to read")
    registry = load_registry(root)
    suites = {s.name: s for s in registry.suites}
    rules = suite_rules(registry.suites)
    gh = None
    if args.head is not None and not _REF.fullmatch(args.head):
        raise UsageError(f"--head {args.head[:80]!r}: name the commit by its SHA")
    if (args.comment or args.checks) and not args.dry_run:
        gh = GitHub.from_env(os.environ, args.repo)  # before the store: a bad setup says so first
    default_store = args.history is None and not os.environ.get(HISTORY_ENV, "").strip()
    source = ""
    if args.last:
        found = baseline_url(os.environ, root)
        if found is None:
            print(f"why --last: no baseline of {args.branch} here: set {HISTORY_ENV} (read only), or run "
                  "`python -m ci history pull` for its trusted snapshot; nothing judged")
            return EXIT_OK
        judged, history = read_last(local_url(args.history, root), found[0], last_runs=HISTORY_RUNS)
        missing, source = "", f" in {found[1]}"
    else:
        judged, history, missing = _read(url, args, default_store=default_store)
    base: Base | None = None
    if args.base:
        base = base_of(args.base, history, _git_time(root, args.base))
    verdicts = judge(judged, history, base=base, suites=rules, branch=args.branch)
    blocked = blocking(verdicts, rules)
    if needs is not None:
        from ci.github.job_plan import PLAN_JOB, PLAN_OUTPUT, gated_by_plan, table

        jobs = table(registry.suites, registry.style, registry.sessions)
        # A job's own verdict blocks whatever its suite accepts: nothing judged it.
        ended = _endings(gh, os.environ, needs) if gh is not None else {}
        of_jobs = judge_jobs(needs, verdicts, {j.id: j.session for j in jobs}, plan_job=PLAN_JOB,
                             plan_output=PLAN_OUTPUT, plan_gated={j.id for j in jobs if gated_by_plan(j)},
                             ended=ended)
        verdicts += of_jobs
        blocked += of_jobs
    commit = judged[-1].commit[:10] if judged else ""
    title = (f"PR #{args.pr}" if args.pr is not None else f"run {args.run}" if args.run is not None
             else f"the last local run ({judged[-1].run_uid[:8]})")
    title += f" at {code(commit, 10, table=False)}" if commit else ""
    note = missing
    if not judged and not missing:
        note = (f"Nothing of PR #{args.pr} is recorded in the history yet: no verdict to give."
                if args.pr is not None else "")
    elif judged and base is None:
        note = f"No merge base given: judged against `{args.branch}`'s latest trusted runs{source}."
    local = f"`python -m ci why --pr {args.pr}` prints it all." if args.pr is not None else ""
    repo = gh.repo if gh is not None else (args.repo or os.environ.get("GITHUB_REPOSITORY", "")).strip()
    server = os.environ.get("GITHUB_SERVER_URL", "").strip() or DEFAULT_SERVER
    runs: list[CheckRun] = []
    links: dict[str, str] = {}
    if args.checks:
        locations = read_junit(args.junit, root) if args.junit is not None else {}
        rows = {v: table_row(v, v in blocked, suites.get(v.suite), repo=repo, server=server)
                for v in verdicts}
        runs = build(sorted({r.suite for r in judged}), verdicts, blocked, rows=rows, locations=locations)
        head = args.head or (judged[-1].commit if judged else "")
        if gh is not None and runs and head:
            try:
                links = publish(gh, runs, head)
                print(f"why: created {len(links)} check run(s) on {head[:10]}: " + ", ".join(links))
            except GitHubError as exc:
                print(f"warning: the check runs were not created ({exc})", file=sys.stderr)
        elif gh is not None and runs:
            print("warning: no commit to put the check runs on; pass --head SHA", file=sys.stderr)
    checks = links_line(runs, links) if runs else ""
    body = markdown(verdicts, blocked, title=title, note=note, suites=suites, rules=rules, local=local,
                    checks=checks, repo=repo, server=server)
    log = Log.from_env()
    if args.checks and args.dry_run and args.json:
        print(json.dumps([r.preview() for r in runs], indent=1))
    elif args.json:
        print(json.dumps([{**asdict(v), "blocks": v in blocked} for v in verdicts], indent=1))
    else:
        print(f"{title}: " + (note if not verdicts and note else text_table(verdicts, blocked)))
        if verdicts and note:
            print(note)
    log.summary(body)
    if args.checks and args.dry_run and not args.json:
        for r in runs:
            print(f"{r.name}: {r.conclusion}, {len(r.annotations)} annotation(s)"
                  + "".join(f"\n    {a.path}:{a.line}: {a.title}" for a in r.annotations))
    if args.comment:
        if args.dry_run:
            print(body)
        elif gh is not None:
            try:
                print(f"why: {upsert_comment(gh, args.pr, body, author=args.author)} on PR #{args.pr}")
            except GitHubError as exc:
                # A fork's PR gets a read-only token: the check still says what blocks.
                print(f"warning: the verdict comment was not written ({exc})", file=sys.stderr)
    if blocked:
        print(f"why: {len(blocked)} blocking verdict(s): " + ", ".join(f"{v.suite}: {v.entry_id} ({v.label})"
                                                                      for v in blocked), file=sys.stderr)
    return EXIT_FAILED if args.gate and blocked else EXIT_OK


def rule_table() -> str:
    """The rule table as Markdown (docs/verdicts.md holds a copy; a test keeps them equal)."""
    rows = ["| order | rule | verdict | when |", "|---:|---|---|---|"]
    rows += [f"| {i} | `{r.id}` | {LABELS[r.verdict]} | {r.says} |" for i, r in enumerate(RULES, 1)]
    return "\n".join(rows)

