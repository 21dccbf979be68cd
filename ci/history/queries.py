"""`python -m ci history …`: what the run history says (flakes, failure streaks, contents).

Exit codes: 0 ok (monitor: no entry is failing), 1 monitor found failing entries,
2 bad input (a malformed URL, an unknown option), 4 the store cannot be used (monitor
--unreachable-ok: 0, after one line saying so).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from ci.durations import DURATIONS_FILE, DurationStore
from ci.errors import EXIT_FAILED, EXIT_OK, StoreError, UsageError
from ci.history.record import import_durations
from ci.history.stats import Flakiness, Streak, flakiness, streaks
from ci.history.store import HISTORY_ENV, HISTORY_FILE, HistoryStore, describe, open_store, resolve_url
from ci.log import Log

if TYPE_CHECKING:
    from ci.history.ingest import Trigger


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `python -m ci history --help`)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m ci history", allow_abbrev=False,
                description="Read the run history: flake rates, failure streaks on main, contents.",
                epilog="Exit codes: 0 ok, 1 monitor found entries failing, 2 bad input, "
                       "4 the history store cannot be used.")
    common = _Parser(add_help=False)
    common.add_argument("--history", metavar="URL",
                        help=f"store URL (default: {HISTORY_ENV}, else {HISTORY_FILE})")
    common.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: .)")
    common.add_argument("--suite", help="only this suite")
    common.add_argument("--hardware", help="only runs on this kind of hardware (cuda, emulated, cpu)")
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("show", parents=[common], help="what the store holds: counts, the last runs")
    flaky = sub.add_parser("flaky", parents=[common], help="flake rate per entry, with counts and window")
    flaky.add_argument("--window", type=int, default=50, help="last N runs of each entry (default: 50)")
    flaky.add_argument("--all", action="store_true", help="also entries that never flaked")
    mon = sub.add_parser("monitor", parents=[common],
                         help="entries failing K consecutive runs on a branch, with the range to bisect")
    mon.add_argument("-k", type=int, default=3, help="consecutive failures (default: 3)")
    mon.add_argument("--branch", default="main", help="branch to watch (default: main)")
    mon.add_argument("--out", type=Path, help="also write the report (Markdown) to this file")
    mon.add_argument("--bisect-plan", type=Path, metavar="FILE",
                     help="also write one JSON line per streak with no bisect answer in the history "
                          "yet: its suite, tier and entry (the inputs of a bisect run)")
    mon.add_argument("--unreachable-ok", action="store_true",
                     help=f"a scheduled job's mode: no store configured (no --history, no {HISTORY_ENV}, "
                          f"no {HISTORY_FILE}) or one that cannot be used is one line and exit 0")
    rec = sub.add_parser("record", parents=[common],
                         help="a CI job's last step: write spooled runs; record the job if its "
                              "session recorded nothing (it failed or was cancelled first)")
    rec.add_argument("--status", required=True, help="the job's status: success, failure, cancelled")
    rec.add_argument("--keep-in", type=Path, metavar="DIR",
                     help=f"then copy {HISTORY_FILE} and {DURATIONS_FILE} into DIR "
                          "(a sharded job's own cache)")
    rec.add_argument("--export", type=Path, metavar="DIR",
                     help="also write this job's runs to DIR as JSON files, marked untrusted, for "
                          "the trusted ingest job (a job that runs PR code holds no store credential)")
    ing = sub.add_parser("ingest", parents=[common],
                         help="the trusted ingest job: record the runs (and a bisect's answer) another "
                              "workflow run exported (DIR: its artifacts), trust and PR taken from its event")
    ing.add_argument("dir", type=Path,
                     help="the artifacts' zip files as the API serves them (or folders of <uid>.json)")
    source = ing.add_mutually_exclusive_group(required=True)
    source.add_argument("--event-file", type=Path,
                        help="the workflow_run event payload ($GITHUB_EVENT_PATH)")
    source.add_argument("--pr", type=int, metavar="N",
                        help="record them as untrusted runs of pull request N into a local SQLite "
                             "store only (the verdict job, which holds no credential; the shared "
                             "store takes trust from the event alone)")
    ing.add_argument("--jobs", type=Path, metavar="FILE",
                     help="also record the run's jobs' wall times: GitHub's job objects, one JSON "
                          "object a line (the ingest job's `gh api …/jobs`); a file that is not there "
                          "is one warning (the fetch failed)")
    ing.add_argument("--dry-run", action="store_true",
                     help="validate and say what would be recorded; open no store, write nothing")
    ing.add_argument("--trusted-workflow", metavar="PATH", default=None,
                     help="the only workflow file whose default-branch runs are trusted (default: "
                          ".github/workflows/pr-test.yml); their head commit must be on the default "
                          "branch of the checkout at --root, a full clone")
    snap = sub.add_parser("snapshot", parents=[common],
                          help="write the store's trusted runs to a fresh SQLite file (the ingest job "
                               "hands it to GPU jobs through the Actions cache)")
    snap.add_argument("out", type=Path, help="the SQLite file to write (replaced)")
    snap.add_argument("--last-runs", type=int, default=300,
                      help="newest trusted runs kept per suite and hardware (default: 300)")
    merge = sub.add_parser("merge", parents=[common],
                           help="merge DIR/*/history.sqlite and DIR/*/durations.json (a sharded job's "
                                "caches) into this checkout's store and durations")
    merge.add_argument("dir", type=Path, help="the folder holding one subfolder per shard")
    # Handled by ci.github.history_pull (through `python -m ci`): listed here for --help.
    sub.add_parser("pull", add_help=False,
                   help="download main's trusted snapshot (the ingest job's artifact) for `why --last`; "
                        "`python -m ci history pull --help`")
    waits = sub.add_parser("waits", parents=[common],
                           help="what a pull request's author waited for: each workflow run's slowest "
                                "hosted job (the jobs' times the ingest job records), newest last")
    waits.add_argument("--event", default="pull_request", help="runs of this event (default: pull_request)")
    waits.add_argument("--last", type=int, default=30, help="the last N runs (default: 30)")
    imp = sub.add_parser("import-durations", parents=[common],
                         help=f"import {DURATIONS_FILE} as one run (done automatically on a new store)")
    imp.add_argument("--hardware-kind", default="cpu", help="the hardware they were measured on")
    return p


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(epoch)) if epoch > 0 else "imported"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=False)]

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()

    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)])


def flaky_table(rates: Sequence[Flakiness]) -> str:
    rows = [(f.entry_id, f"{f.rate:.0%}", str(f.flakes), str(f.retried), str(f.split), str(f.runs),
             f"{_when(f.first_at)} .. {_when(f.last_at)}") for f in rates]
    return _table(("entry", "flake rate", "flakes", "passed on retry", "failed on a passing commit",
                   "runs", "window"), rows)


def monitor_markdown(found: Sequence[Streak], *, branch: str, k: int) -> str:
    if not found:
        return f"### Failure monitor ({branch})\n\nNo entry failed {k} consecutive runs on `{branch}`."
    lines = [f"### Failure monitor ({branch})", "",
             f"{len(found)} entr{'y' if len(found) == 1 else 'ies'} failed {k}+ consecutive runs.", "",
             "| suite | entry | failures | last passing | first failing | reasons |",
             "|---|---|---:|---|---|---|"]
    for s in found:
        reasons = "<br>".join(r.replace("|", "\\|") for r in s.reasons)
        lines.append(f"| {s.suite} | `{s.entry_id}` | {s.failures} | "
                     f"`{s.last_passing_commit[:12] or 'never passed'}` | `{s.first_failing_commit[:12]}` | "
                     f"{reasons} |")
    return "\n".join(lines)


def monitor_text(found: Sequence[Streak], *, branch: str, k: int) -> str:
    if not found:
        return f"monitor: no entry failed {k} consecutive runs on {branch}"
    out = [f"monitor: {len(found)} entr{'y' if len(found) == 1 else 'ies'} failed {k}+ consecutive "
           f"runs on {branch}"]
    for s in found:
        good = s.last_passing_commit[:12] or "(never passed)"
        out.append(f"  {s.suite}: {s.entry_id}: {s.failures} failures since {_when(s.since)}; "
                   f"bisect {good}..{s.first_failing_commit[:12]}")
        out += [f"      {r}" for r in s.reasons]
    return "\n".join(out)


def _warn(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _job_step(args: argparse.Namespace, root: Path, url: str, log: Log) -> int:
    """`record` and `merge`: the steps around a CI job's session; a store problem never fails them."""
    from ci.history.job import merge_durations, merge_stores, record_job
    from ci.registry.loader import load_registry

    if args.command == "record":
        suite = load_registry(root).get(args.suite or "")
        if not args.suite:
            raise UsageError("record needs --suite NAME (the job's session)")
        uids = record_job(root, url, suite=args.suite, needs_gpus=bool(suite and suite.needs_gpus),
                          status=args.status, env=os.environ, warn=_warn, note=log.line)
        if args.export is not None:
            _export(root, url, uids, args.export, log)
        if args.keep_in is not None:
            args.keep_in.mkdir(parents=True, exist_ok=True)
            for rel in (HISTORY_FILE, DURATIONS_FILE):
                if (root / rel).is_file():
                    shutil.copyfile(root / rel, args.keep_in / Path(rel).name)
        return EXIT_OK
    folder = args.dir if args.dir.is_absolute() else root / args.dir
    shards = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    durations = merge_durations(root / DURATIONS_FILE,
                                [p / Path(DURATIONS_FILE).name for p in shards])
    stores = [p / Path(HISTORY_FILE).name for p in shards if (p / Path(HISTORY_FILE).name).is_file()]
    try:
        with open_store(url) as store:
            added = merge_stores(store, stores, _warn)
    except StoreError as exc:
        _warn(f"history: merge skipped ({exc})")
        return EXIT_OK
    log.line(f"history: merged {len(stores)} shard store(s) ({added} new run(s)) and "
             f"{durations} duration(s) from {folder}")
    return EXIT_OK


def _export(root: Path, url: str, uids: list[str], folder: Path, log: Log) -> None:
    from ci.history.ingest import export

    folder = folder if folder.is_absolute() else root / folder
    try:
        with open_store(url) as store:
            written = export(store, uids, folder, _warn)
    except (StoreError, OSError) as exc:
        _warn(f"history: nothing exported ({exc})")
        return
    log.line(f"history: exported {written} run(s) to {folder} for the ingest job")


def _ingest(args: argparse.Namespace, root: Path, url: str, log: Log) -> int:
    """`ingest DIR --event-file F` (or `--pr N`, into a local store): validate every exported
    run, then record them all."""
    from ci.history.ingest import (
        BISECT_WORKFLOW,
        ONE_FILE_WORKFLOW,
        TRUSTED_WORKFLOW,
        Trigger,
        collect_batch,
        ingest_batch,
        read_event,
        trigger,
    )
    from ci.history.on_branch import on_branch

    folder = args.dir if args.dir.is_absolute() else root / args.dir
    # The step output `trusted`: how many trusted runs were added; the ingest job refreshes the
    # GPU jobs' snapshot only after one.
    empty = not folder.is_dir() or not any(folder.iterdir())  # most runs have no GPU job
    if args.jobs is not None and args.pr is not None:
        raise UsageError("--jobs goes with --event-file: a job's times are recorded with the run's event")
    if empty and args.jobs is None:
        log.line(f"ingest: no exported run in {folder}; nothing to do")
        log.output("trusted", "0")
        return EXIT_OK
    if args.pr is not None:
        if args.pr < 1:
            raise UsageError(f"--pr {args.pr}: a pull request number is 1 or more")
        if not url.startswith("sqlite:"):
            raise UsageError(f"--pr records into a local SQLite store only, not {describe(url)}: "
                             "the shared store takes trust and PR from the workflow_run event "
                             "(--event-file)")
        source = Trigger(run_id=0, workflow="this workflow run", event="pull_request", trusted=False,
                         pr=args.pr)
    else:
        # Whether the run's head is on the default branch: this checkout's history says, never
        # the branch's name (a tag can carry it).
        def reach(sha: str, branch: str) -> bool:
            if not empty:
                return on_branch(root, sha, branch)
            try:  # only the jobs' times to record: a checkout without the branch is no reason to stop
                return on_branch(root, sha, branch)
            except UsageError as exc:
                _warn(f"ingest: the jobs' times are recorded as untrusted ({exc})")
                return False

        payload = read_event(args.event_file)
        source = trigger(payload, run_file=ONE_FILE_WORKFLOW,
                         trusted_workflow=args.trusted_workflow or TRUSTED_WORKFLOW,
                         on_branch=reach,
                         bisect_workflow=BISECT_WORKFLOW)
        if source.doubt:
            _warn(f"ingest: {source.describe()}: not trusted, {source.doubt}")
    if args.jobs is not None:
        # The commit the run tested, GitHub's word in the event (a record's commit must match it
        # only where the run is trusted; a job's time names it whoever's run it was).
        run = payload.get("workflow_run") if isinstance(payload, dict) else None
        head = run.get("head_sha") if isinstance(run, dict) else None
        commit = head if isinstance(head, str) and len(head) <= 64 else ""
        _ingest_jobs(args.jobs, source, commit, url, log, dry_run=args.dry_run)
    if empty:
        log.line(f"ingest: no exported run in {folder}; nothing more to do")
        log.output("trusted", "0")
        return EXIT_OK
    batch = collect_batch(folder, trigger=source, now=time.time(),
                          on_default=lambda sha: on_branch(root, sha, source.branch))
    runs = batch.runs
    answers = f", {len(batch.bisects)} bisect answer(s)" if batch.bisects else ""
    if args.dry_run:
        log.line(f"ingest: {source.describe()}: {len(runs)} valid run(s){answers} would be recorded "
                 f"({', '.join(sorted({r.suite for r in runs})) or 'none'}); nothing written")
        return EXIT_OK
    with open_store(url) as store:
        added, bisected = ingest_batch(store, batch)
    log.line(f"ingest: {source.describe()}: {len(runs)} run(s), {added} new"
             + (f"; {len(batch.bisects)} bisect answer(s), {bisected} new" if batch.bisects else "")
             + f", in {describe(url)}")
    log.output("trusted", str(added if source.trusted else 0))
    return EXIT_OK


def _ingest_jobs(path: Path, source: Trigger, commit: str, url: str, log: Log, *, dry_run: bool) -> None:
    """`ingest --jobs FILE`: the run's jobs' wall times, with the event's word on event, PR and trust."""
    from ci.history.job_times import read_jobs, record_job_times

    if not path.is_file():
        _warn(f"ingest: no jobs' times at {path} (the fetch of the run's jobs failed?); none recorded")
        return
    rows = read_jobs(path, run_id=str(source.run_id), attempt=source.run_attempt or 1, event=source.event,
                     commit=commit, pr=source.pr, trusted=source.trusted)
    if dry_run:
        log.line(f"ingest: {len(rows)} job time(s) would be recorded; nothing written")
        return
    with open_store(url) as store:
        added = record_job_times(store, rows)
    log.line(f"ingest: {source.describe()}: {len(rows)} job time(s), {added} new")


def _waits(args: argparse.Namespace, url: str) -> int:
    """`waits`: each run's slowest hosted job, the last `--last`, and a one-line summary."""
    from ci.history.job_times import job_times, summary, waits

    if args.last < 1:
        raise UsageError("--last must be at least 1")
    with open_store(url, create=False) as store:
        found = waits(job_times(store, event=args.event), event=args.event)[-args.last:]
    if args.json:
        print(json.dumps([asdict(w) for w in found], indent=1))
        return EXIT_OK
    for w in found:
        pr = f"PR #{w.pr}" if w.pr else "-"
        print(f"  {_when(w.started_at)}  {w.commit[:10] or '-':<10}  {pr:<9}  {w.seconds / 60:5.1f} min  "
              f"{w.slowest} (slowest of {w.jobs} hosted jobs)")
    print(summary(found, last=args.last))
    return EXIT_OK


def _snapshot(args: argparse.Namespace, root: Path, url: str, log: Log) -> int:
    from ci.history.ingest import snapshot

    if args.last_runs < 1:
        raise UsageError("--last-runs must be at least 1")
    out = args.out if args.out.is_absolute() else root / args.out
    if out.resolve() == Path(url.split(":///", 1)[-1]).resolve():
        raise UsageError(f"snapshot {out}: that is the store it reads; name another file")
    with open_store(url) as store:
        kept = snapshot(store, out, last_runs=args.last_runs)
    log.line(f"history: {kept} trusted run(s) of {describe(url)} written to {out}")
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    if args.command == "pull":
        raise UsageError("`history pull` runs as `python -m ci history pull` (it talks to GitHub)")
    root = args.root.resolve()
    url = resolve_url(args.history, os.environ, root)
    if url is None:
        raise UsageError("--history off: there is no store to read")
    if getattr(args, "window", 1) < 1 or getattr(args, "k", 1) < 1:
        raise UsageError("--window and -k must be at least 1")
    log = Log.from_env()
    if args.command in ("record", "merge"):
        return _job_step(args, root, url, log)
    if args.command == "ingest":
        return _ingest(args, root, url, log)
    if args.command == "snapshot":
        return _snapshot(args, root, url, log)
    if args.command == "waits":
        return _waits(args, url)
    if getattr(args, "unreachable_ok", False):
        return _soft_monitor(args, root, url, log)
    return _read(args, root, url, log)


def _soft_monitor(args: argparse.Namespace, root: Path, url: str, log: Log) -> int:
    """The scheduled monitor: a missing or unusable store says so in one line and passes."""
    configured = args.history is not None or os.environ.get(HISTORY_ENV, "").strip()
    if not configured and not (root / HISTORY_FILE).is_file():
        _warn(f"monitor: no history store to read; set {HISTORY_ENV} (the ci-history "
              "environment's secret) to the shared store's URL")
        return EXIT_OK
    try:
        return _read(args, root, url, log)
    except StoreError as exc:
        _warn(f"monitor: skipped, the history store cannot be used ({exc})")
        return EXIT_OK


def _read(args: argparse.Namespace, root: Path, url: str, log: Log) -> int:
    # show, flaky and monitor only read: a store that is not there is an error, never made.
    with open_store(url, create=args.command == "import-durations") as store:
        if args.command == "import-durations":
            durations = DurationStore(root / DURATIONS_FILE).load()
            added = import_durations(store, durations, hardware=args.hardware_kind)
            print(f"imported {len(durations)} durations" if added else "already imported (or none)")
            return EXIT_OK
        # `show` lists every run; flake rates and the monitor's streaks judge trusted runs only
        # (a pull request's runs could otherwise fake passes or failures on main).
        rows = store.attempts(suite=args.suite, hardware=args.hardware, last_runs=5000,
                              trusted_only=args.command != "show")
        if args.command == "show":
            counts = store.counts()
            if args.json:
                print(json.dumps(counts))
            else:
                print(f"{describe(url)}: schema {store.version}; " +
                      ", ".join(f"{v} {k}" for k, v in counts.items()))
                runs = list({r.run_uid: r for r in rows}.values())[-10:]
                for r in runs:
                    print(f"  {_when(r.started_at)}  {r.suite}  {r.branch or '-'}  {r.commit[:10] or '-'}  "
                          f"{r.hardware}  {r.event}"
                          + ("" if r.trusted else f"  untrusted (PR #{r.pr})" if r.pr else "  untrusted"))
            return EXIT_OK
        if args.command == "flaky":
            rates = sorted(flakiness(rows, window=args.window).values(),
                           key=lambda f: (-f.rate, -f.flakes, f.entry_id))
            if not args.all:
                rates = [f for f in rates if f.flakes]
            if args.json:
                print(json.dumps([{**asdict(f), "rate": f.rate} for f in rates], indent=1))
            elif rates:
                print(flaky_table(rates))
            else:
                print(f"no flaky entry in the last {args.window} runs of each entry")
            return EXIT_OK
        found, gone = registered(streaks(rows, branch=args.branch, k=args.k), root)
        for s in gone:
            _warn(f"monitor: {s.suite}: {s.entry_id[:120]!r} failed {s.failures} runs but is not in the "
                  "registry (deleted, or never registered): ignored, no alert and no bisect")
        md = monitor_markdown(found, branch=args.branch, k=args.k)
        if gone:
            md += (f"\n\n{len(gone)} failing entr{'y' if len(gone) == 1 else 'ies'} not in the registry "
                   "(deleted, or never registered) ignored.")
        from ci.history.job_times import job_times, summary, waits

        pr_waits = waits(job_times(store, event="pull_request"))
        if pr_waits:  # what pull requests' authors waited for, beside what main broke
            md += f"\n\nPull requests' {summary(pr_waits, last=30)}."
        if args.json:
            print(json.dumps([asdict(s) for s in found], indent=1))
        else:
            print(monitor_text(found, branch=args.branch, k=args.k))
        log.summary(md)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(md + "\n", encoding="utf-8")
        if args.bisect_plan is not None:
            plan = bisect_plan(store, found, root)
            args.bisect_plan.parent.mkdir(parents=True, exist_ok=True)
            args.bisect_plan.write_text("".join(json.dumps(p, sort_keys=True) + "\n" for p in plan),
                                        encoding="utf-8")
        return EXIT_FAILED if found else EXIT_OK


def registered(found: Sequence[Streak], root: Path) -> tuple[list[Streak], list[Streak]]:
    """The streaks of entries the checkout's registry has, and the others.

    An entry that was deleted (or a name a forged record made up) never runs again, so its
    streak would never end: it would alert, and plan a bisect that cannot run, every hour.
    """
    from ci.registry.loader import load_registry
    from ci.select.discover import discover
    from ci.select.entries import resolve_entry, suite_entries

    if not found:
        return [], []  # nothing failing: the registry is not read
    registry = load_registry(root)
    files = discover(root)
    ids: dict[str, set[str]] = {}
    for name in sorted({s.suite for s in found}):
        suite = registry.get(name)
        ids[name] = set()
        if suite is None:
            continue
        for entry in suite_entries(suite, files):
            tf = files.get(entry.path)
            if tf is None:
                continue  # a file the registry lists but the checkout lacks: gone too
            try:
                ids[name].add(resolve_entry(entry, tf, default_timeout=suite.timeout,
                                            pytest_only=suite.takes_pytest_args).id)
            except UsageError:
                continue  # an entry the registry cannot resolve never runs either
    kept = [s for s in found if s.entry_id in ids[s.suite]]
    return kept, [s for s in found if s.entry_id not in ids[s.suite]]


def bisect_plan(store: HistoryStore, found: Sequence[Streak], root: Path) -> list[dict[str, str]]:
    """The streaks to bisect: known good somewhere, of a suite the registry has, and with no
    answer in the history for the same entry and first failing commit (the monitor runs
    hourly; one bisect per streak is enough)."""
    from ci.history.bisects import bisected
    from ci.registry.loader import load_registry

    registry = load_registry(root)
    out = []
    for s in found:
        suite = registry.get(s.suite)
        if suite is None or not s.last_passing_commit:
            why = "its suite is not in the registry" if suite is None else "it never passed"
            _warn(f"monitor: no bisect of {s.entry_id} ({s.suite}): {why}")
        elif not bisected(store, s.entry_id, bad=s.first_failing_commit):
            out.append({"suite": s.suite, "tier": suite.tier, "entry": s.entry_id})
    return out

