"""PR comment commands: parse a comment, authorise its author against the access policy.

Pure functions. The gateway workflow (ci.github.gateway) runs them on the default branch's
code, never the PR's, and acts only on an `Allowed` answer. Everything else is a
`Refused` with one line saying why; a comment that is no command is `Ignored`.

The policy is `.github/ci-access.json` in the repository:

    {"commands": {"rerun-test": {"associations": ["OWNER", "MEMBER"],
                                 "users": ["alice"], "teams": ["gpu-ci"]},
                  "help": {"anyone": true}}}

A command that the policy does not name is refused for everyone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal, get_args

from ci.errors import UsageError

CommandName = Literal["rerun-test", "rerun-failed", "run-ci", "bisect", "help"]
COMMANDS: tuple[CommandName, ...] = get_args(CommandName)
# The commands that start work on a GPU runner; a fork PR never gets them.
RUNS_CODE: frozenset[CommandName] = frozenset({"rerun-test", "rerun-failed", "run-ci", "bisect"})
POLICY_PATH = ".github/ci-access.json"
# GitHub's `author_association` values.
ASSOCIATIONS = ("OWNER", "MEMBER", "COLLABORATOR", "CONTRIBUTOR", "FIRST_TIME_CONTRIBUTOR",
                "FIRST_TIMER", "MANNEQUIN", "NONE")
USAGE: dict[CommandName, str] = {
    "rerun-test": "/rerun-test <registered test file>: run that one file on this PR's head commit",
    "rerun-failed": "/rerun-failed: re-run the failed jobs of this PR's latest run",
    "run-ci": "/run-ci <label>: run the suite that label gates on this PR's head commit",
    "bisect": "/bisect <registered test file>: find the commit of main that broke it (the monitor's streak)",
    "help": "/help: list the commands you may use here",
}
_ARGS: dict[CommandName, int] = {"rerun-test": 1, "rerun-failed": 0, "run-ci": 1, "bisect": 1, "help": 0}
_LOGIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?")
# What a commenter wrote is quoted back under the bot's name only when it is a plain word:
# never markdown (an image, a link, a mention), never longer than a path or a label.
_PLAIN = re.compile(r"[A-Za-z0-9._/+=:,-]{1,100}")
# The gateway workflow starts only on a comment whose body starts with this (its `if:`,
# ci.github.gateway_workflow); the parser reads exactly those comments as commands.
COMMAND_PREFIX = "/"


def quoted(text: str) -> str:
    """A commenter's word for a reply: in backticks when plain, else a placeholder."""
    return f"`{text}`" if _PLAIN.fullmatch(text) else "(not shown: not a plain word)"


@dataclass(frozen=True, kw_only=True)
class Command:
    """One parsed comment command."""

    name: CommandName
    arg: str | None = None


@dataclass(frozen=True, kw_only=True)
class Malformed:
    """A comment that starts like a command but is not one; `why` says what to type."""

    why: str


# GitHub ends a comment's line at a newline only. str.splitlines() also ends one at U+2028,
# U+0085, a form feed and the like, which GitHub shows inside the same line: read that way,
# "/rerun-failed<U+2028>/run-ci x" ran /rerun-failed although its line, as shown, is no command.
_LINE_END = re.compile(r"\r\n|\r|\n")


def first_line(body: str) -> str:
    """The comment's first line as GitHub shows it: up to the first CR or LF."""
    return _LINE_END.split(body, maxsplit=1)[0]


def parse_comment(body: str) -> Command | Malformed | None:
    """The command on the comment's first line; None when it is no command.

    A command is a body that starts with `/` (not a blank line, not an indented code
    block): exactly the comments the gateway workflow starts on. Only the first line
    counts, so quoting a command in a discussion runs nothing.
    """
    if not body.startswith(COMMAND_PREFIX):
        return None
    word, *args = first_line(body).split()
    name = word[1:]
    if name not in COMMANDS:
        return Malformed(why=f"unknown command {quoted(word)}; known: "
                             + ", ".join(f"/{c}" for c in COMMANDS))
    command: CommandName = name  # checked against COMMANDS above
    if len(args) != _ARGS[command]:
        return Malformed(why=f"{word} takes {_ARGS[command] or 'no'} argument"
                             f"{'s' if _ARGS[command] != 1 else ''}; usage: {USAGE[command]}")
    return Command(name=command, arg=args[0] if args else None)


@dataclass(frozen=True, kw_only=True)
class Grant:
    """Who may use one command."""

    anyone: bool = False
    associations: frozenset[str] = frozenset()
    users: frozenset[str] = frozenset()  # GitHub logins, compared case-insensitively
    teams: frozenset[str] = frozenset()  # team slugs the gateway found the author in

    def admits(self, actor: str, association: str, teams: Iterable[str]) -> str | None:
        """Why the author is admitted, or None."""
        if self.anyone:
            return "anyone may"
        if association in self.associations:
            return f"{association} may"
        if actor.casefold() in {u.casefold() for u in self.users}:
            return f"{actor} is listed"
        shared = sorted(self.teams & set(teams))
        return f"team {shared[0]} may" if shared else None


@dataclass(frozen=True, kw_only=True)
class Policy:
    """The access policy: command -> who may use it."""

    grants: Mapping[CommandName, Grant]


def _strings(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise UsageError(f"{POLICY_PATH}: {where} must be a list of strings")
    return frozenset(value)


def parse_policy(data: Any) -> Policy:
    """Validate the policy's JSON; any unknown key or value is an error, never ignored."""
    if not isinstance(data, dict) or set(data) != {"commands"} or not isinstance(data["commands"], dict):
        raise UsageError(f'{POLICY_PATH}: expected {{"commands": {{<command>: {{...}}}}}}')
    grants: dict[CommandName, Grant] = {}
    for name, spec in data["commands"].items():
        if name not in COMMANDS:
            raise UsageError(f"{POLICY_PATH}: unknown command {name!r}; known: {', '.join(COMMANDS)}")
        if not isinstance(spec, dict):
            raise UsageError(f"{POLICY_PATH}: commands.{name} must be an object")
        unknown = sorted(set(spec) - {"anyone", "associations", "users", "teams"})
        if unknown:
            raise UsageError(f"{POLICY_PATH}: commands.{name}: unknown key(s) {', '.join(unknown)}; "
                             "known: anyone, associations, users, teams")
        anyone = spec.get("anyone", False)
        if not isinstance(anyone, bool):
            raise UsageError(f"{POLICY_PATH}: commands.{name}.anyone must be true or false")
        if anyone and name in RUNS_CODE:
            raise UsageError(f"{POLICY_PATH}: commands.{name}: `anyone` is only for help; a command "
                             "that starts a GPU job needs associations, users or teams")
        associations = _strings(spec.get("associations", []), f"commands.{name}.associations")
        bad = sorted(associations - set(ASSOCIATIONS))
        if bad:
            raise UsageError(f"{POLICY_PATH}: commands.{name}: unknown association(s) {', '.join(bad)}; "
                             f"known: {', '.join(ASSOCIATIONS)}")
        grants[name] = Grant(anyone=anyone, associations=associations,
                             users=_strings(spec.get("users", []), f"commands.{name}.users"),
                             teams=_strings(spec.get("teams", []), f"commands.{name}.teams"))
    return Policy(grants=grants)


def load_policy(root: Path) -> Policy | None:
    """The repository's policy; None when it has none (every command then refused)."""
    path = root / POLICY_PATH
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{POLICY_PATH}: not valid JSON ({exc})") from None
    return parse_policy(data)


@dataclass(frozen=True, kw_only=True)
class Context:
    """Who commented where, as the gateway read it from the event and the API."""

    actor: str
    association: str
    on_pull_request: bool = True
    from_fork: bool = False
    teams: frozenset[str] = frozenset()
    # Why team membership could not be read (ci.github.teams); None when it was, or not needed.
    teams_unavailable: str | None = None


@dataclass(frozen=True, kw_only=True)
class Allowed:
    command: Command
    why: str


@dataclass(frozen=True, kw_only=True)
class Refused:
    why: str


@dataclass(frozen=True, kw_only=True)
class Ignored:
    why: str = "the comment's first line is no /command"


Verdict = Allowed | Refused | Ignored


def _outside(path: str) -> bool:
    p = PurePosixPath(path)
    return p.is_absolute() or ".." in p.parts or "\\" in path


def authorise(body: str, ctx: Context, policy: Policy | None, *,
              registered: Mapping[str, str], labels: Iterable[str]) -> Verdict:
    """Whether the comment's command may run; `registered` maps test file -> suite."""
    parsed = parse_comment(body)
    if parsed is None:
        return Ignored()
    if isinstance(parsed, Malformed):
        return Refused(why=parsed.why)
    if not ctx.on_pull_request:
        return Refused(why=f"/{parsed.name} works only in pull request comments")
    if policy is None:
        return Refused(why=f"comment commands are off: this repository has no {POLICY_PATH}")
    if not _LOGIN.fullmatch(ctx.actor) or ctx.association not in ASSOCIATIONS:
        return Refused(why=f"cannot tell who {quoted(ctx.actor)} ({quoted(ctx.association)}) is")
    grant = policy.grants.get(parsed.name)
    admitted = grant.admits(ctx.actor, ctx.association, ctx.teams) if grant else None
    if admitted is None and grant and grant.teams and ctx.teams_unavailable:
        return Refused(why=f"{ctx.actor} ({ctx.association}) may use /{parsed.name} only through "
                           f"team {', '.join(sorted(grant.teams))}, which the gateway cannot check: "
                           f"{ctx.teams_unavailable}")
    if admitted is None:
        return Refused(why=f"{ctx.actor} ({ctx.association}) may not use /{parsed.name} "
                           f"(see {POLICY_PATH})")
    if parsed.name in RUNS_CODE and ctx.from_fork:
        return Refused(why=f"/{parsed.name} never runs on a pull request from a fork "
                           "(its code would reach the GPU runners)")
    if parsed.name in ("rerun-test", "bisect"):
        path = parsed.arg or ""
        if _outside(path):
            return Refused(why=f"{quoted(path)} is outside the repository: name a registered test file")
        norm = PurePosixPath(path).as_posix()  # ./tests/x.py, tests//x.py: tests/x.py
        if norm not in registered:
            return Refused(why=f"{quoted(norm)} is not a registered test file (see `python -m ci audit`)")
        parsed = Command(name=parsed.name, arg=norm)  # what the gateway resolves is the registered path
    if parsed.name == "run-ci":
        known = sorted(labels)
        if parsed.arg not in known:
            return Refused(why=f"unknown CI label {quoted(parsed.arg or '')}; known: {', '.join(known)}")
    return Allowed(command=parsed, why=admitted)


def teams_to_check(body: str, ctx: Context, policy: Policy | None) -> frozenset[str]:
    """The policy's teams whose membership could change the verdict on this comment.

    Empty when the comment is no command, or its author is admitted without a team: the
    gateway then asks GitHub nothing. `/help` asks about every team the policy names.
    """
    parsed = parse_comment(body)
    if policy is None or not isinstance(parsed, Command):
        return frozenset()
    names = COMMANDS if parsed.name == "help" else (parsed.name,)
    out: set[str] = set()
    for name in names:
        grant = policy.grants.get(name)
        if grant and grant.teams and grant.admits(ctx.actor, ctx.association, ()) is None:
            out |= grant.teams
    return frozenset(out)


def allowed_commands(ctx: Context, policy: Policy | None) -> list[CommandName]:
    """The commands `/help` lists for its author."""
    if policy is None:
        return []
    return [name for name in COMMANDS
            if (g := policy.grants.get(name)) and g.admits(ctx.actor, ctx.association, ctx.teams)
            and not (name in RUNS_CODE and ctx.from_fork)]
