"""`python -m ci`: the one command-line entry. Each subcommand lives in its own module."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from ci.args import one_line
from ci.errors import EXIT_INTERRUPTED, EXIT_USAGE, CIError
from ci.interrupts import PROCESS

# name -> (module exposing `main(argv) -> int`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("ci.session", "run a suite (a nox session's work): plan, run, report"),
    "audit": ("ci.audit", "check that every test file is registered, declares NUM_GPUS and runs something"),
    "plan": ("ci.event_plan", "show which CI jobs and sessions an event and its labels would run"),
    "lock-gpus": ("ci.lock_cli", "run a command holding N GPUs exclusively (fair FIFO queue)"),
    "gpu-status": ("ci.lock_cli", "show each GPU: free or held, by whom, since when; waiters"),
    "changed": ("ci.changed", "list (or run) the test files a branch adds or modifies vs its base"),
    "workflows": ("ci.workflow", "generate .github/workflows from the registry; --check for drift"),
    "import-workflow": ("ci.import_workflow", "write .slime-ci/suites.py from slime's pr-test.yml.j2 matrix"),
    "adopt": ("ci.adopt", "switch a slime-shaped repository to this toolkit (registry, noxfile, U, CI)"),
    "history": ("ci.history.cli", "the run history: flake rates (flaky), failure streaks (monitor), show"),
    "coverage": ("ci.coverage", "write the coverage page: every test file, who runs it, how it fared"),
    "lock": ("ci.lock", "write the constraints files every session installs from; --check for drift"),
    "mutation": ("ci.mutation", "mutate the core modules; do their tests notice? (score per module)"),
    "plants": ("ci.plants", "apply each planted break to a scratch copy; its entry must fail for its reason"),
}


def _usage() -> str:
    width = max(len(n) for n in SUBCOMMANDS)
    lines = ["usage: slime-ci <command> [options]   (or python -m ci; slime-ci <command> --help)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "exit codes: 0 ok, 1 tests failed, 2 bad input, 3 nothing registered, "
              "4 history store unusable, 124 timed out waiting, 130 interrupted"]
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
    try:
        if name == "run":
            PROCESS.install()  # before anything else: see ci/interrupts.py
        module = importlib.import_module(SUBCOMMANDS[name][0])
        entry = module.status_main if name == "gpu-status" else module.main
        code = int(entry(rest))
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
    if name == "run":
        PROCESS.close()
        code = PROCESS.exit_code(code)
    return code
