"""invoke tasks: the toolkit's commands for people who prefer `invoke` (see `invoke --list`).

Each task forwards to `python -m ci`, so both spellings behave identically.
"""

from __future__ import annotations

import sys

from invoke import Context, Exit, task

from ci.cli import main as ci_main


def _ci(*argv: str) -> None:
    code = ci_main(list(argv))
    if code:
        raise Exit(code=code)


def _command_after_dashes() -> list[str]:
    # invoke re-joins what follows `--` with spaces and loses quoting; the shell already
    # split it correctly, so take the tokens straight from our own argv.
    argv = sys.argv
    return argv[argv.index("--") + 1:] if "--" in argv else []


@task(
    help={
        "count": "number of GPUs to hold (any free ones)",
        "devices": "exact GPU ids, e.g. 0,2 (instead of --count)",
        "total_gpus": "GPUs on this machine (default: NVML's count, else 8)",
        "timeout": "seconds to wait for the GPUs before giving up (exit 124)",
        "target_env_name": "variable that receives the GPU ids (default CUDA_VISIBLE_DEVICES)",
        "lock_path_pattern": "lock files, must contain {gpu_id}",
        "print_only": "print the GPUs that are free now and hold nothing",
        "expect": "seconds CMD is expected to hold them (e.g. its p90): lets it backfill",
        "no_backfill": "strict FIFO: never start ahead of an earlier waiter",
    }
)
def lock_gpus(c: Context, count: str = "", devices: str = "", total_gpus: str = "",
              timeout: str = "", target_env_name: str = "", lock_path_pattern: str = "",
              print_only: bool = False, expect: str = "", no_backfill: bool = False) -> None:
    """Run `-- CMD…` holding GPUs exclusively (fair queue; exit code of CMD passes through)."""
    # Every value is passed on as typed: `python -m ci` checks it (`--count abc` is one line,
    # exit 2) and `--timeout 0` means "do not wait" there, not "unset".
    given = {"--count": count, "--devices": devices, "--total-gpus": total_gpus,
             "--timeout": timeout, "--target-env-name": target_env_name,
             "--lock-path-pattern": lock_path_pattern, "--expect": expect}
    argv = [part for flag, value in given.items() if value != "" for part in (flag, value)]
    if print_only:
        argv.append("--print-only")
    if no_backfill:
        argv.append("--no-backfill")
    _ci("lock-gpus", *argv, "--", *_command_after_dashes())


@task(help={"lock_path_pattern": "lock files, must contain {gpu_id}",
            "total_gpus": "GPUs on this machine (default: NVML's count, else 8)"})
def gpu_status(c: Context, lock_path_pattern: str = "", total_gpus: str = "") -> None:
    """Show each GPU: free or held, holder pid and command, since when; the waiters."""
    given = {"--lock-path-pattern": lock_path_pattern, "--total-gpus": total_gpus}
    argv = [part for flag, value in given.items() if value != "" for part in (flag, value)]
    _ci("gpu-status", *argv)


@task(help={"root": "checkout to audit (default: .)"})
def audit(c: Context, root: str = ".") -> None:
    """Check every test file: registered, declares NUM_GPUS, runs something."""
    _ci("audit", "--root", root)


@task(help={"event": "pull_request, push or workflow_dispatch",
            "labels": "comma-separated PR labels, e.g. run-ci-megatron,run-ci-ckpt"})
def plan(c: Context, event: str = "pull_request", labels: str = "") -> None:
    """Show which CI jobs and nox sessions an event with these labels would run, and why."""
    _ci("plan", "--event", event, *(["--labels", labels] if labels else []))


@task(help={"check": "do not write; exit 1 with a diff when the committed workflow is stale"})
def workflows(c: Context, check: bool = False) -> None:
    """Generate .github/workflows from the registry."""
    _ci("workflows", *(["--check"] if check else []))


@task(help={"base": "compare with this ref (default origin/main)",
            "affected": "also tests that import changed modules",
            "json": "print the plan as JSON"})
def changed(c: Context, base: str = "origin/main", affected: bool = False, json: bool = False) -> None:
    """List the test files this branch adds or modifies, with their GPU counts."""
    _ci("changed", "--base", base, *(["--affected"] if affected else []),
        *(["--json"] if json else []))
