"""The sessions: one per tier. Each is a docstring and a few lines that call `python -m ci`.

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

from ci import profiles  # noqa: E402

nox.options.sessions = ["cpu_unit"]
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_external_run = True

# Posargs that make a GPU session run its entries in this environment instead of Docker.
LOCAL_FLAGS = {"--no-docker", "--emulate-gpus"}


def _install(session: nox.Session, *names: str) -> None:
    """Install pyproject profiles (torch first, alone), then this repo with --no-deps."""
    pyproject = nox.project.load_toml(ROOT / "pyproject.toml")
    reqs = [r for name in names for r in profiles.requirements(pyproject, name)]
    if reqs:
        torch, rest = profiles.split_torch(list(dict.fromkeys(reqs)))
        if torch:
            session.install(*profiles.torch_install_args(torch, os.environ))
        session.install(*rest)
    session.install("-e", ".", "--no-deps")


def _suite(session: nox.Session, suite: str, *extra: str) -> None:
    session.run("python", "-m", "ci", "run", "--suite", suite, *extra, *session.posargs)


def _gpu_session(session: nox.Session, suite: str, *extra_profiles: str) -> None:
    # In Docker the image brings the stack: the host venv needs only the runner (stdlib)
    # and NVML to count the GPUs.
    local = bool(LOCAL_FLAGS & set(session.posargs))
    _install(session, "gpu-host", *(["e2e"] if local else []), *extra_profiles)
    _suite(session, suite)


@nox.session(tags=["cpu", "ci"])
def cpu_unit(session: nox.Session) -> None:
    """CPU tier: every NUM_GPUS = 0 test of slime's core, in parallel (-- FILES, -k EXPR, --dry-run)."""
    _install(session, "cpu")
    _suite(session, "cpu_unit")


@nox.session(tags=["cpu", "ci"])
def agent_adapter(session: nox.Session) -> None:
    """Agent tier: OpenAI/Anthropic adapters and trajectories, driven by the real SDK clients."""
    _install(session, "agent")
    _suite(session, "agent_adapter")


@nox.session(tags=["cpu", "ci"])
def toolkit(session: nox.Session) -> None:
    """The CI toolkit's own tests: audit, runner, GPU lock, changed, workflows, Docker, Ray."""
    _install(session, "dev")
    session.run("python", "-m", "ci", "audit")
    _suite(session, "toolkit")


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


@nox.session(tags=["gpu"])
def sglang_config(session: nox.Session) -> None:
    """GPU tier: rollout-engine deployment configurations (label run-ci-sglang-config)."""
    _gpu_session(session, "sglang_config")


@nox.session(tags=["gpu"])
def megatron(session: nox.Session) -> None:
    """GPU tier: the core training matrix (-- --gpus N, --dry-run, --shard I/K, --emulate-gpus)."""
    _gpu_session(session, "megatron")


@nox.session(tags=["gpu"])
def precision(session: nox.Session) -> None:
    """GPU tier: numerical consistency across parallel layouts (label run-ci-precision)."""
    _gpu_session(session, "precision")


@nox.session(tags=["gpu"])
def ckpt(session: nox.Session) -> None:
    """GPU tier: checkpoint save/load combinations (label run-ci-ckpt)."""
    _gpu_session(session, "ckpt")


@nox.session(tags=["gpu"])
def image(session: nox.Session) -> None:
    """GPU tier: the megatron matrix on the test image (label run-ci-image)."""
    _gpu_session(session, "image")


@nox.session(tags=["gpu"])
def changed(session: nox.Session) -> None:
    """Test files this branch adds or modifies vs origin/main, each on its NUM_GPUS (-- --affected)."""
    _gpu_session(session, "changed", "git")


@nox.session(tags=["cpu", "ci"])
def gpu_smoke(session: nox.Session) -> None:
    """The GPU tier without GPUs: megatron entries on emulated GPUs under real locks."""
    _install(session, "e2e", "gpu-host")
    session.run("python", "-m", "ci", "run", "--suite", "megatron", "--emulate-gpus",
                "--gpus", "4", *session.posargs)
