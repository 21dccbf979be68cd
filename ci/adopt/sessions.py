"""The nox sessions of a repository that adopted the toolkit: one per suite of its registry.

Its noxfile.py (written by `slime-ci adopt`) is three lines that call `register`. Each
session installs the suite's profile (the registry's PROFILES; torch first and alone, so
SLIME_CI_TORCH_INDEX can point it at the CPU wheels), the toolkit from the noxfile's
requirement, and the repository itself `-e . --no-deps` (its own `slime`), then runs
`python -m ci run --suite <name>`; GPU sessions that run in Docker install only the toolkit
and NVML. Session names are the suites', as in the toolkit's own repository, which also has
`history` (the record step of every CI job) and `monitor` (the hourly failure monitor).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ci.errors import UsageError
from ci.github.job_plan import CHECK_SESSION
from ci.history.store import HISTORY_SESSION
from ci.registry import profiles
from ci.registry.loader import Registry, load_registry
from ci.registry.model import (
    ISSUES_COMMAND,
    MONITOR_COMMAND,
    MONITOR_PURPOSE,
    MONITOR_SESSION,
    VERDICT_COMMAND,
    VERDICT_PURPOSE,
    VERDICT_SESSION,
    Suite,
)

# Posargs that make a GPU session run its entries in this environment instead of Docker.
LOCAL_FLAGS = frozenset({"--no-docker", "--emulate-gpus"})
# `req; extra == "x"` or `req; <marker> and extra == "x"`, as the build writes Requires-Dist.
_EXTRA_MARKER = re.compile(r"""^(?P<req>[^;]*?)\s*;\s*(?:(?P<other>.*?)\s+and\s+)?"""
                           r"""extra\s*==\s*['"](?P<extra>[^'"]+)['"]\s*$""")


def toolkit_extra(name: str) -> tuple[str, ...]:
    """The requirements of one of the toolkit's own extras, `slime-ci[other]` expanded.

    One source, pyproject.toml: read directly when this `ci` runs from the toolkit's checkout,
    else from the installed distribution's metadata (which the build wrote from that file).
    """
    pyproject = _checkout_pyproject() or _installed_pyproject()
    try:
        return tuple(profiles.requirements(pyproject, name))
    except KeyError:
        raise UsageError(f"the slime-ci toolkit has no extra {name!r}; reinstall it "
                         f"(pip install --force-reinstall slime-ci)") from None


def _checkout_pyproject() -> Mapping[str, Any] | None:
    path = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if not path.is_file():
        return None  # an installed wheel: site-packages has no pyproject.toml
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10 reading a checkout: take the metadata instead
        return None
    data: Mapping[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    return data if data.get("project", {}).get("name") == profiles.PROJECT_NAME else None


def _installed_pyproject() -> Mapping[str, Any]:
    """The extras of the installed slime-ci, shaped as pyproject.toml's table."""
    try:
        requires = importlib.metadata.requires(profiles.PROJECT_NAME) or []
    except importlib.metadata.PackageNotFoundError:
        raise UsageError("the slime-ci toolkit is neither installed nor run from its checkout: "
                         "pip install slime-ci") from None
    extras: dict[str, list[str]] = {}
    for req in requires:
        match = _EXTRA_MARKER.match(req)
        if match:
            other = match.group("other")
            extras.setdefault(match.group("extra"), []).append(
                f"{match.group('req')}; {other}" if other else match.group("req"))
    return {"project": {"name": profiles.PROJECT_NAME, "optional-dependencies": extras}}


def install_steps(suite: Suite, registry: Registry, toolkit: str,
                  posargs: Sequence[str], env: Mapping[str, str]) -> list[list[str]]:
    """The `pip install` argument lists of one session, in order (pure)."""
    local = not suite.needs_gpus or bool(LOCAL_FLAGS & set(posargs))
    reqs: list[str] = list(registry.profiles.get(suite.profile, ())) if local else []
    if suite.profile not in registry.profiles and local:
        known = ", ".join(registry.profiles) or "none"
        raise KeyError(f"suite {suite.name}: no profile {suite.profile!r} in PROFILES of the "
                       f"registry; known: {known}")
    # Every run plans from the run history and records itself there (`ci.history.record`):
    # without SQLAlchemy a CPU session only spools its record and plans without it.
    reqs += toolkit_extra("gpu-host" if suite.needs_gpus else "history")
    if suite.dynamic:
        reqs += toolkit_extra("git")  # its entries come from a git diff
    steps: list[list[str]] = []
    torch, rest = profiles.split_torch(list(dict.fromkeys(reqs)))
    if torch:
        steps.append(profiles.torch_install_args(torch, env))
    if rest:
        steps.append(rest)
    steps.append([toolkit])
    if local:
        steps.append(["-e", ".", "--no-deps"])  # the repository's own packages, as its old CI did
    return steps


def register(noxfile: str, *, toolkit: str) -> Registry:
    """Register one nox session per suite of the registry next to `noxfile`, and `workflows`."""
    import nox

    root = Path(noxfile).resolve().parent
    registry = load_registry(root)
    nox.options.default_venv_backend = "venv"
    nox.options.error_on_external_run = True
    for suite in registry:
        _session(nox, suite, registry, toolkit)

    def workflows(session: Any) -> None:
        session.install(toolkit)
        session.run("python", "-m", "ci", "workflows", "--check", *session.posargs)

    workflows.__doc__ = "Generated workflow and U files are current with the registry (--check)."
    nox.session(name=CHECK_SESSION, tags=["cpu", "ci"])(workflows)
    _history_sessions(nox, toolkit)
    return registry


def _history_sessions(nox: Any, toolkit: str) -> None:
    """`history` (each CI job's record step runs `-- record`) and `monitor` (the hourly job)."""
    def history(session: Any) -> None:
        session.install(toolkit, *toolkit_extra("history"))
        session.run("python", "-m", "ci", "history", *session.posargs)

    def monitor(session: Any) -> None:
        session.install(toolkit, *toolkit_extra("history"))
        session.run(*ISSUES_COMMAND)
        session.run(*MONITOR_COMMAND, *session.posargs)

    def verdict(session: Any) -> None:
        session.install(toolkit, *toolkit_extra("history"))
        session.run(*VERDICT_COMMAND, *session.posargs)

    history.__doc__ = ("The run history: show, flaky, monitor; in CI each job's last step records its "
                       "run (`-- record`).")
    monitor.__doc__ = f"{MONITOR_PURPOSE} (the hourly CI job)."
    verdict.__doc__ = f"{VERDICT_PURPOSE} (the PR's verdict job)."
    # Not tagged ci: `nox -t ci` runs suites; these are a job's last step and a schedule's job.
    nox.session(name=HISTORY_SESSION, tags=[])(history)
    nox.session(name=MONITOR_SESSION, tags=[])(monitor)
    nox.session(name=VERDICT_SESSION, tags=[])(verdict)


def _session(nox: Any, suite: Suite, registry: Registry, toolkit: str) -> None:
    def run_suite(session: Any) -> None:
        for args in install_steps(suite, registry, toolkit, session.posargs, os.environ):
            session.install(*args)
        # The registry's host defaults (cache mounts of the old CI); the environment wins.
        env = {k: v for k, v in registry.host_env.items() if k not in os.environ}
        session.run("python", "-m", "ci", "run", "--suite", suite.name, *session.posargs, env=env)

    label = f" (label {suite.label})" if suite.label else ""
    run_suite.__doc__ = f"{suite.purpose}{label}."
    run_suite.__name__ = run_suite.__qualname__ = suite.name
    nox.session(name=suite.name, tags=[suite.tier, *([] if suite.needs_gpus else ["ci"])])(run_suite)
