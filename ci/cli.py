"""`python -m ci`: the one command-line entry. Each subcommand lives in its own module."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ci.args import one_line
from ci.errors import EXIT_INTERRUPTED, EXIT_USAGE, CIError
from ci.interrupts import PROCESS


@dataclass(frozen=True, kw_only=True)
class Command:
    """One subcommand: the function that runs it and its one-line help."""

    target: str  # "module:function"; the function takes argv and returns the exit code
    help: str
    # SIGINT/SIGTERM only recorded while it runs, and its exit code 130 when one came
    # (ci/interrupts.py): a run must stop its entries and still write its report.
    records_signals: bool = False
    # Subcommands of it that another layer implements: `history pull` talks to GitHub, which
    # the history package (below ci.github) may not import.
    delegates: tuple[tuple[str, str], ...] = ()


SUBCOMMANDS: dict[str, Command] = {
    "run": Command(target="ci.run.command:main",
                   help="run a suite (a nox session's work): plan, run, report", records_signals=True),
    "smoke": Command(target="ci.run.smoke:main",
                     help="run a smoke's suites (gpu_smoke) at once on one set of emulated GPUs",
                     records_signals=True),
    "audit": Command(target="ci.select.audit:main",
                     help="check that every test file is registered, declares NUM_GPUS and runs something"),
    "plan": Command(target="ci.github.job_plan:main",
                    help="show which CI jobs and sessions an event and its labels would run"),
    "lock-gpus": Command(target="ci.gpu.lock_gpus:main",
                         help="run a command holding N GPUs exclusively (fair FIFO queue)"),
    "gpu-status": Command(target="ci.gpu.lock_gpus:status_main",
                          help="show each GPU: free or held, by whom, since when; waiters"),
    "changed": Command(target="ci.select.changed:main",
                       help="list (or run) the test files a branch adds or modifies vs its base"),
    "actions": Command(target="ci.actions.actions_cli:main",
                       help="run the generated workflows for one event with act, here: jobs, commands"),
    "workflows": Command(target="ci.github.workflow:main",
                         help="generate .github/workflows from the registry; --check for drift"),
    "import-workflow": Command(target="ci.adopt.import_workflow:main",
                               help="write .slime-ci/suites.py from slime's pr-test.yml.j2 matrix"),
    "adopt": Command(target="ci.adopt.switch:main",
                     help="switch a slime-shaped repository to this toolkit (registry, noxfile, U, CI)"),
    "history": Command(target="ci.history.queries:main",
                       help="the run history: flake rates (flaky), failure streaks (monitor), show, "
                            "pull (main's trusted snapshot)",
                       delegates=(("pull", "ci.github.history_pull:main"),)),
    "why": Command(target="ci.github.pr_verdicts:main",
                   help="why each failed entry of a PR or run failed: new, on main, flaky, infra (--gate)"),
    "issues": Command(target="ci.github.flaky_issues:main",
                      help="one GitHub issue per quarantined or main-breaking entry; closes when clean"),
    "hud": Command(target="ci.hud.hud_cli:main",
                   help="build the HUD: a static site of the history (commits by entries, trends, GPUs)"),
    "coverage": Command(target="ci.quality.files_page:main",
                        help="write the coverage page: every test file, who runs it, how it fared"),
    "lock": Command(target="ci.registry.constraints:main",
                    help="write the constraints files every session installs from; --check for drift"),
    "mutation": Command(target="ci.quality.mutation:main",
                        help="mutate the core modules; do their tests notice? (score per module)",
                        records_signals=True),
    "bisect": Command(target="ci.bisect.bisect_cli:main",
                      help="find the commit that broke an entry (or raised its flake rate), in parallel "
                           "on free GPUs", records_signals=True),
    "select-audit": Command(target="ci.quality.select_audit:main",
                            help="replay the planted breaks against selection by executed code: "
                                 "recall and GPU-seconds saved"),
    "plants": Command(target="ci.quality.plants:main",
                      help="apply each planted break to a scratch copy; its entry must fail for its reason"),
}


def _usage() -> str:
    width = max(len(n) for n in SUBCOMMANDS)
    lines = ["usage: slime-ci <command> [options]   (or python -m ci; slime-ci <command> --help)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {command.help}" for name, command in SUBCOMMANDS.items()]
    lines += ["", "exit codes: 0 ok, 1 tests failed, 2 bad input, 3 nothing registered, "
              "4 history store unusable, 5 cluster unreachable, 124 timed out waiting, 130 interrupted"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else EXIT_USAGE
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"error: unknown command {name!r}; known: {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return EXIT_USAGE
    command = SUBCOMMANDS[name]
    try:
        if command.records_signals:
            PROCESS.install()  # before anything else: see ci/interrupts.py
        target = dict(command.delegates).get(rest[0], command.target) if rest else command.target
        if target != command.target:
            rest = rest[1:]
        module_name, function = target.split(":")
        code = int(getattr(importlib.import_module(module_name), function)(rest))
    except CIError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        code = exc.exit_code
    except OSError as exc:
        # A path the user gave that the system refuses in a way no check above foresaw
        # (a name too long, a loop of links): still one line and exit 2, never a traceback.
        where = f"{exc.filename}: " if exc.filename is not None else ""
        print(f"error: {one_line(f'{where}{exc.strerror or exc}')}; check the paths given",
              file=sys.stderr)
        code = EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    if command.records_signals:
        code = PROCESS.exit_code(code)
        if argv is None:
            PROCESS.close()  # this process exits next: a late signal must not replace the code
        else:
            # Called as a library (a test, another tool): the caller keeps its process, and a
            # SIGTERM it ignores would be inherited by every child it starts from here on.
            PROCESS.restore()
    return code
