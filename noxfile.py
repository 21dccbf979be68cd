"""The sessions: one per suite of the registry (generated below), plus `lint` and `gpu_smoke`.

    nox -l                       list sessions and what they are for
    nox -s cpu_unit              the CPU correctness tier, in its own venv
    nox -s megatron -- --gpus 8  the core GPU matrix (Docker) on this box's GPUs
    nox -t ci                    everything CI runs on a CPU machine
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from ci import lock, profiles  # noqa: E402
from ci.registry import load_registry  # noqa: E402
from ci.suites import PLANTS_CADENCE, Suite  # noqa: E402

nox.options.sessions = ["cpu_unit"]
nox.options.default_venv_backend = "venv"
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
        held = lock.constraint_args(ROOT, python, disabled=lock.lock_disabled(session.posargs, os.environ))
    except lock.LockMissing as exc:
        session.error(str(exc))
    if reqs:
        torch, rest = profiles.split_torch(list(dict.fromkeys(reqs)))
        if torch:
            session.install(*profiles.torch_install_args(torch, os.environ), *held)
        session.install(*rest, *held)
    session.install("-e", ".", "--no-deps")
    session.run("python", "-c", _ADD_CHECKOUT, WORKLOAD_PTH, str(ROOT), silent=True)


def _posargs(session: nox.Session) -> list[str]:
    """The session's arguments for `python -m ci run` (`--no-lock` is the install's)."""
    return lock.strip_lock_flag(session.posargs)


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
        for step in BEFORE.get(suite.name, ()):
            session.run(*step)
        _suite(session, suite.name)

    label = f" (label {suite.label})" if suite.label else ""
    run_suite.__doc__ = f"{suite.purpose}{label}."
    run_suite.__name__ = run_suite.__qualname__ = suite.name
    tags = [suite.tier, *([] if suite.needs_gpus else ["ci"])]
    nox.session(name=suite.name, tags=tags)(run_suite)


# Commands a suite's session runs before the suite itself.
BEFORE: dict[str, tuple[tuple[str, ...], ...]] = {
    "toolkit": (("python", "-m", "ci", "audit"),),  # the registry is sound before its tests run
}

# One session per suite of the registry: adding a Suite to ci/suites.py adds its session.
for _registered in load_registry(ROOT):
    _suite_session(_registered)


# Sessions that are not suites.


@nox.session(tags=["cpu", "ci"])
def lint(session: nox.Session) -> None:
    """Generated workflow is current and passes zizmor and the schemas; ruff everywhere, mypy on ci/."""
    _install(session, "lint")
    session.run("python", "-m", "ci", "workflows", "--check")
    session.run("zizmor", "--offline", "--persona", "pedantic", ".github/workflows")
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)
    session.run("check-jsonschema", "--builtin-schema", "vendor.compose-spec",
                "runners/docker-compose.yml")
    session.run("ruff", "check", ".")
    session.run("mypy")


@nox.session(tags=["cpu", "ci"])
def gpu_smoke(session: nox.Session) -> None:
    """The GPU tier without GPUs: megatron, precision, one ckpt entry, sglang_config (emulated)."""
    _install(session, "e2e", "gpu-host")
    for suite, *only in SMOKE:
        session.run("python", "-m", "ci", "run", "--suite", suite, "--emulate-gpus", "--gpus", "8",
                    "--retries", str(SMOKE_RETRIES), *(("--only", *only) if only else ()), *_posargs(session))


@nox.session
def history(session: nox.Session) -> None:
    """The run history: show, flaky, monitor; in CI each job's last step records its run (`-- record`)."""
    _install(session, "history")
    session.run("python", "-m", "ci", "history", *_posargs(session))


@nox.session(tags=["nightly"])
def mutation(session: nox.Session) -> None:
    """Mutation score per core module (ci.suites.MUTATION_TARGETS); nightly and on demand, not -t ci."""
    _install(session, "mutation")
    session.run("python", "-m", "ci", "mutation", *session.posargs)


@nox.session(tags=["cpu", PLANTS_CADENCE])
def plants(session: nox.Session) -> None:
    """Every planted break (tests/e2e/plants) makes the entry that claims it fail, for its reason.

    The subset PLANTS_CI of ci/suites.py also runs in the toolkit suite (tests/toolkit/test_plants.py).
    """
    _install(session, "dev", "gpu-host")
    session.run("python", "-m", "ci", "plants", *session.posargs)


# On the 2-core CI host an emulated entry has, once in a few dozen runs, lost a Ray worker
# (Ray's SYSTEM_ERROR; what killed it is not known yet, and a failing job now prints the crash
# lines of the head's worker logs). One rerun; an entry that passes on it is reported FLAKY in
# the summary table and the JUnit file, never as a plain pass.
SMOKE_RETRIES = 1

# What `gpu_smoke` runs of each GPU suite: all of it, or the one entry named. Of ckpt's five
# optimizer-location combinations the one that crosses devices on both save and load runs
# here; the label job runs all five.
SMOKE: tuple[tuple[str, ...], ...] = (
    ("megatron",),
    ("precision",),
    ("ckpt", "gpu --load-optimizer cpu"),
    ("sglang_config",),
)
