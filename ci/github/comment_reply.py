"""`python -m ci plan --event issue_comment`: the gateway's answer to one PR comment."""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ci.errors import UsageError
from ci.github.comment_commands import Context, load_policy, teams_to_check
from ci.github.gateway import comment_plan, registered, render_comment_plan
from ci.github.teams import lookup
from ci.registry.model import Suite
from ci.select.discover import discover

_SHA = re.compile(r"[0-9a-f]{40}")


def comment_main(args: argparse.Namespace, root: Path, suites: Sequence[Suite]) -> int:
    """Print what the gateway does for the comment on the command line (exit 0 for every verdict)."""
    missing = [f"--{n}" for n in ("comment", "actor", "association") if getattr(args, n) is None]
    if missing:
        raise UsageError(f"--event issue_comment needs {', '.join(missing)}")
    if args.labels or args.added or args.action:
        raise UsageError("--labels, --added and --action only apply to pull_request")
    if args.sha is not None and not _SHA.fullmatch(args.sha):
        raise UsageError(f"--sha {args.sha!r}: expected a full 40-hex commit id")
    ctx = Context(actor=args.actor, association=args.association.upper(),
                  on_pull_request=not args.not_pr, from_fork=bool(args.fork),
                  teams=frozenset(t.strip() for t in args.teams.split(",") if t.strip()))
    policy = load_policy(root)
    if args.team_org:
        # Only the teams that could change the verdict are asked about, and only here.
        found = lookup(ctx.actor, args.team_org, teams_to_check(args.comment, ctx, policy) - ctx.teams,
                       os.environ)
        ctx = replace(ctx, teams=ctx.teams | found.teams, teams_unavailable=found.unavailable)
    plan = comment_plan(args.comment, ctx, policy, suites=suites, files=discover(root),
                        pr=args.pr, sha=args.sha)
    print(json.dumps(plan, indent=2) if args.json else render_comment_plan(plan))
    return 0


def resolve_main(args: argparse.Namespace, root: Path, suites: Sequence[Suite]) -> int:
    """`plan --event workflow_dispatch --suite S [--only FILE]`: what run-ci-file.yml runs, or exit 2."""
    if args.event != "workflow_dispatch":
        raise UsageError("--suite only applies to --event workflow_dispatch")
    if args.sha is not None and not _SHA.fullmatch(args.sha):
        raise UsageError(f"--sha {args.sha!r}: expected a full 40-hex commit id")
    suite = next((s for s in suites if s.name == args.suite), None)
    if suite is None:
        raise UsageError(f"unknown suite {args.suite!r}; known: {', '.join(s.name for s in suites)}")
    resolved = None
    if args.only:
        resolved = registered([suite], discover(root)).get(args.only)
        if resolved is None:
            raise UsageError(f"{args.only} is not a registered test file of {suite.name}")
    out = {"suite": suite.name, "tier": suite.tier, "sha": args.sha, "only": args.only or None,
           "command_line": resolved.command if resolved else f"nox -s {suite.name}",
           "num_gpus": resolved.num_gpus if resolved else None, "image": suite.image}
    print(json.dumps(out, indent=2) if args.json else
          f"{out['command_line']} on {args.sha or 'the PR head'} ({suite.tier} runner)")
    return 0
