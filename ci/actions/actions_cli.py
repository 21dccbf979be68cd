"""`python -m ci actions EVENT`: the generated workflows for one event, run by act on this machine.

    python -m ci actions pull_request --labels run-ci-megatron --paths-from changed.txt
    python -m ci actions push                      # caches saved as a push to main saves them
    python -m ci actions schedule --cron '17 2 * * *'
    python -m ci actions issue_comment --comment '/rerun-test tests/test_x.py' --actor octocat
    python -m ci actions pull_request --dry-run    # the act command lines, nothing run
    python -m ci actions pull_request --labels run-ci-ckpt --real --real-jobs ckpt \
        --real-only 'gpu --load-optimizer cpu' \
        --patch tests/e2e/plants/test_tiny_ckpt/scheduler-step-lost.patch

Every job runs on this host (act's host mode); GitHub's actions, `gh` and the REST API are
local stand-ins, each saying it is one; `nox` records its argv and exits 0, except the
sessions that only wire CI (history, verdict, monitor), which run their real commands.
`--real` runs the real sessions instead, `--real-jobs ckpt` in the named jobs only (the rest record).
Exit 0 when every job that ran succeeded, 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

from ci.actions import events, harness
from ci.actions.act_argv import CONCURRENT_JOBS, quoted
from ci.actions.outcome_table import as_json, render
from ci.args import Parser, existing_dir
from ci.errors import EXIT_FAILED, EXIT_OK, UsageError
from ci.github.job_plan import read_paths
from ci.github.pages_workflow import HUD_SESSION
from ci.registry.model import MONITOR_SESSION, VERDICT_SESSION

# The sessions whose work is CI's own wiring: run for real even by the recording nox (the
# HUD's build too: the Pages job deploys the folder it writes).
WIRING_SESSIONS = ("history", VERDICT_SESSION, MONITOR_SESSION, HUD_SESSION)


def real_sessions(root: Path) -> dict[str, list[list[str]]]:
    """The registered commands of the wiring sessions (pure over the registry)."""
    from ci.registry.loader import load_registry
    from ci.registry.model import Check

    registry = load_registry(root)
    return {s.name: [list(c) for c in s.commands] for s in registry.sessions
            if isinstance(s, Check) and s.name in WIRING_SESSIONS}


def gpu_sessions(root: Path) -> list[str]:
    """The suites that need GPUs: `--real` runs them on emulated GPUs."""
    from ci.registry.loader import load_registry

    return [s.name for s in load_registry(root) if s.needs_gpus]


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _split(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def parse_spec(args: argparse.Namespace) -> events.EventSpec:
    """The command line as an EventSpec; flags that do not fit the event are a UsageError."""
    if (args.cron is not None) != (args.event == "schedule"):
        raise UsageError("schedule needs --cron '<the cron that fired>', and only it takes --cron")
    if (args.comment is not None) != (args.event == "issue_comment"):
        raise UsageError("issue_comment needs --comment BODY, and only it takes --comment")
    if args.event != "pull_request" and (args.labels or args.fork or args.action or args.added
                                         or args.paths is not None or args.paths_from is not None
                                         or args.patch is not None):
        raise UsageError(f"--labels, --action, --added, --fork, --paths and --patch only apply to "
                         f"pull_request, not {args.event}")
    if sum(x is not None for x in (args.paths, args.paths_from, args.patch)) > 1:
        raise UsageError("pass one of --paths, --paths-from and --patch")
    if args.patch is not None and not args.patch.is_file():
        raise UsageError(f"--patch {args.patch}: no such file; pass a diff (git diff > FILE)")
    paths: tuple[str, ...] | None = _split(args.paths) if args.paths is not None else None
    if args.paths_from is not None:
        paths = tuple(read_paths(args.paths_from))
    labels = list(_split(args.labels))
    if args.added and args.added not in labels:
        labels.append(args.added)
    inputs = dict(x.split("=", 1) for x in args.input) if args.input else {}
    if any("=" not in x for x in args.input or ()):
        raise UsageError("--input takes NAME=VALUE")
    if inputs and args.event != "workflow_dispatch":
        raise UsageError("--input only applies to workflow_dispatch")
    return events.EventSpec(name=args.event, labels=tuple(labels), action=args.action, added=args.added,
                            fork=args.fork, paths=paths, patch=args.patch, cron=args.cron,
                            comment=args.comment, actor=args.actor, association=args.association,
                            inputs=inputs)


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m ci actions",
                    description="Run the generated workflows for one event with act, on this machine, "
                                "and show which jobs ran, their commands and the GitHub requests.",
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("event", choices=[e for e in get_args(events.ActEvent) if e != "workflow_run"],
                        help="what triggered the run (workflow_run follows by itself)")
    parser.add_argument("--labels", default="", metavar="A,B", help="labels on the pull request")
    parser.add_argument("--action", choices=["opened", "synchronize", "reopened", "labeled"], default=None,
                        help="pull_request activity (default: synchronize)")
    parser.add_argument("--added", metavar="LABEL", default=None, help="the label a `labeled` event added")
    parser.add_argument("--fork", action="store_true", help="the pull request comes from a fork")
    parser.add_argument("--paths", default=None, metavar="A,B",
                        help="the files the PR changes (a commit touching them is made in the clone)")
    parser.add_argument("--paths-from", type=Path, default=None, metavar="FILE",
                        help="the same, from a file (one a line or NUL-separated)")
    parser.add_argument("--patch", type=Path, default=None, metavar="FILE",
                        help="the PR's change is this diff, applied on the base (a planted break, "
                             "tests/e2e/plants/*/*.patch, say)")
    parser.add_argument("--cron", default=None, help="schedule: the cron that fired")
    parser.add_argument("--comment", default=None, metavar="BODY", help="issue_comment: the comment's text")
    parser.add_argument("--actor", default="octocat", help="who triggered it (issue_comment: the commenter)")
    parser.add_argument("--association", default="MEMBER",
                        help="issue_comment: the commenter's author_association (MEMBER, NONE, ...)")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=VALUE",
                        help="workflow_dispatch input (repeatable)")
    parser.add_argument("--real", action="store_true",
                        help="run the real nox sessions (GPU suites on emulated GPUs): minutes, not seconds")
    parser.add_argument("--real-jobs", default="", metavar="A,B",
                        help="with --real: only these job ids run their real sessions (ckpt, say); "
                             "every other job's nox records its argv. The table's nox column says which")
    parser.add_argument("--real-only", default=None, metavar="SELECTOR",
                        help="with --real: the real GPU suites run only the entries matching SELECTOR "
                             "(their `--only`: one ckpt entry is 'gpu --load-optimizer cpu')")
    parser.add_argument("--fail", action="append", default=[], metavar="SESSION",
                        help="the recording nox exits 1 for SESSION (repeatable): a red job's path")
    parser.add_argument("--state", type=Path, default=None, metavar="DIR",
                        help="keep the clone, act's logs, caches and artifacts in DIR (kept across runs)")
    parser.add_argument("--concurrent-jobs", type=_positive, default=CONCURRENT_JOBS, metavar="N",
                        help=f"jobs act runs at once when their needs allow (default {CONCURRENT_JOBS})")
    parser.add_argument("--dry-run", action="store_true", help="print the act command lines; run nothing")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: .)")
    return parser


def main(argv: Sequence[str]) -> int:
    """`python -m ci actions`: run one event's workflows through act."""
    args = _parser().parse_args(list(argv))
    root = existing_dir("--root", args.root)
    spec = parse_spec(args)
    options = harness.Options(act=harness.find_act(os.environ), real=args.real, dry_run=args.dry_run,
                              real_jobs=_split(args.real_jobs), real_only=args.real_only,
                              fail={s: 1 for s in args.fail}, real_sessions=real_sessions(root),
                              gpu_sessions=gpu_sessions(root) if args.real else (),
                              state=args.state.resolve() if args.state else None,
                              concurrent_jobs=args.concurrent_jobs)
    session = harness.Session(root, options)
    try:
        outcome = session.run(spec)
    finally:
        session.close()
    if args.dry_run:
        for call in outcome.calls:
            print(f"# {call.workflow}\n{quoted(call.argv)}")
        return EXIT_OK
    print(json.dumps(as_json(outcome), indent=2) if args.json else render(outcome))
    return EXIT_FAILED if any(j.result == "failure" for j in outcome.jobs) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
