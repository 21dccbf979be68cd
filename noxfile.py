"""The sessions: one per suite of the registry and one per entry of its SESSIONS (lint, gpu_smoke, …).

    nox -l                       list sessions and what they are for
    nox -s cpu_unit              the CPU correctness tier, in its own venv
    nox -s megatron -- --gpus 8  the core GPU matrix (Docker) on this box's GPUs
    nox -t ci                    everything CI runs on a CPU machine
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from ci.registry import constraints, profiles  # noqa: E402
from ci.registry.loader import load_registry  # noqa: E402
from ci.registry.model import Check, Smoke, Suite  # noqa: E402

nox.options.sessions = ["cpu_unit"]
# uv where it is installed (`pip install nox uv`): the same pinned installs in seconds instead
# of minutes, each session still in its own venv; plain venv + pip where it is not.
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_external_run = True

# Posargs that make a GPU session run its entries in this environment instead of Docker.
LOCAL_FLAGS = {"--no-docker", "--emulate-gpus"}


# The toolkit's wheel holds `ci` alone; `slime/`, the framework these sessions test, is put
# on each venv's path by a .pth file naming the checkout (what an editable install of a
# separate `slime` distribution would do), so an adopter's `slime` is never ours.
WORKLOAD_PTH = "slime-ci-workload.pth"
_ADD_CHECKOUT = ("import pathlib, sys, sysconfig; "
                 "pathlib.Path(sysconfig.get_paths()['purelib'], sys.argv[1])"
                 ".write_text(sys.argv[2] + chr(10))")


def _install(session: nox.Session, *names: str) -> None:
    """Install pyproject profiles (torch first, alone) held to the lock, then the toolkit with
    --no-deps and this checkout on the path (for `slime/`).

    The lock is constraints/py<X.Y>.txt (`python -m ci lock`); `--no-lock` among the session's
    arguments or SLIME_CI_NO_LOCK=1 resolves fresh instead.
    """
    pyproject = nox.project.load_toml(ROOT / "pyproject.toml")
    reqs = [r for name in names for r in profiles.requirements(pyproject, name)]
    # A session without its own `python=` runs on nox's interpreter.
    python = session.python if isinstance(session.python, str) else "{}.{}".format(*sys.version_info[:2])
    try:
        disabled = constraints.constraints_disabled(session.posargs, os.environ)
        held = constraints.constraint_args(ROOT, python, disabled=disabled)
    except constraints.ConstraintsMissing as exc:
        session.error(str(exc))
    if reqs:
        torch, rest = profiles.split_torch(list(dict.fromkeys(reqs)))
        if torch:
            links = _pip_find_links() if session.venv_backend == "uv" else []
            session.install(*profiles.torch_install_args(torch, os.environ, find_links=links), *held)
        session.install(*rest, *held)
    session.install("-e", ".", "--no-deps")
    session.run("python", "-c", _ADD_CHECKOUT, WORKLOAD_PTH, str(ROOT), silent=True)


def _pip_find_links() -> list[str]:
    """Where pip is configured to find wheels: uv does not read pip's configuration, and a
    machine may provide the CPU build of the torch pin only there."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                            text=True, check=False)
    return profiles.pip_find_links(listed.stdout)


def _posargs(session: nox.Session) -> list[str]:
    """The session's arguments for `python -m ci run` (`--no-lock` is the install's)."""
    return constraints.strip_no_lock_flag(session.posargs)


def _suite(session: nox.Session, suite: str, *extra: str) -> None:
    session.run("python", "-m", "ci", "run", "--suite", suite, *extra, *_posargs(session))


def _suite_session(suite: Suite) -> None:
    """Register the nox session of one suite: its name, its purpose as the docstring `nox -l`
    shows, tags from its tier, and an install from its profile."""

    def run_suite(session: nox.Session) -> None:
        if suite.needs_gpus:
            # In Docker the image brings the stack: the host venv needs only the runner
            # (stdlib) and NVML to count the GPUs; run here, it needs the suite's profile.
            local = bool(LOCAL_FLAGS & set(session.posargs))
            _install(session, "gpu-host", *([suite.profile] if local else []),
                     *(["git"] if suite.dynamic else []))  # entries come from a git diff
        else:
            _install(session, suite.profile)
        for step in suite.before:
            session.run(*step)
        _suite(session, suite.name)

    label = f" (label {suite.label})" if suite.label else ""
    run_suite.__doc__ = f"{suite.purpose}{label}."
    run_suite.__name__ = run_suite.__qualname__ = suite.name
    tags = [suite.tier, *([] if suite.needs_gpus else ["ci"])]
    nox.session(name=suite.name, tags=tags)(run_suite)


# One session per suite of the registry: adding a Suite to ci/registry/repo_suites.py adds its session.
_registry = load_registry(ROOT)
for _registered in _registry:
    _suite_session(_registered)


def _expand(args: tuple[str, ...]) -> list[str]:
    """A command's arguments, each one with `*` a glob under the checkout (ci.suites.Check)."""
    out: list[str] = []
    for arg in args:
        out += sorted(str(p) for p in ROOT.glob(arg)) if "*" in arg else [arg]
    return out


def _check_session(check: Check) -> None:
    """Register the nox session of a check of the registry: its commands, in order."""

    def run_check(session: nox.Session) -> None:
        _install(session, *check.profiles)
        for i, command in enumerate(check.commands):
            last = i == len(check.commands) - 1
            session.run(*_expand(command), *(_posargs(session) if check.posargs and last else ()))

    _register(run_check, check.name, f"{check.purpose}.", check.tags)


def _smoke_session(smoke: Smoke) -> None:
    """Register the nox session of a smoke of the registry: GPU suites on emulated GPUs."""

    def run_smoke(session: nox.Session) -> None:
        _install(session, *smoke.profiles)
        # Its suites' runs at once, on one set of GPU locks (ci/run/smoke.py).
        record = ("--record-executed",) if smoke.record_executed else ()
        session.run("python", "-m", "ci", "smoke", smoke.name, *record, *_posargs(session))

    _register(run_smoke, smoke.name, f"{smoke.purpose}.", smoke.tags)


def _register(func: Callable[[nox.Session], None], name: str, doc: str, tags: tuple[str, ...]) -> None:
    func.__doc__ = doc
    func.__name__ = func.__qualname__ = name
    nox.session(name=name, tags=list(tags))(func)


# The sessions that are not suites (SESSIONS in ci/registry/repo_suites.py): lint, the GPU smoke, history,
# mutation, plants, the lock check. Their CI jobs come from the same data (ci/github/job_plan.py).
for _session in _registry.sessions:
    if isinstance(_session, Smoke):
        _smoke_session(_session)
    else:
        _check_session(_session)
