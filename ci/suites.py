"""The registry: the only list of suites and entries. Data only; `ci.plan` resolves it.

A test file's GPU count is never written here: it lives in the file as
`NUM_GPUS = N` and is read by `ci.discover`. Rule-based suites take every test
file under their `include` directories (minus `exclude`); GPU suites list their
entries, because the same file may run several times with different arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Tier = Literal["cpu", "gpu"]
CPU_TIER: Tier = "cpu"
GPU_TIER: Tier = "gpu"
# Install profiles are extras in pyproject.toml; "image" means: use what the Docker image has.
Profile = Literal["cpu", "agent", "e2e", "dev", "lint"]

# What a tier means to GitHub Actions: the labels of its runners, a job's time limit.
GPU_RUNNER_LABELS: tuple[str, ...] = ("self-hosted", "gpu")
JOB_MINUTES: dict[Tier, int] = {"cpu": 60, "gpu": 720}

FRAMEWORK_IMAGE = "slimerl/slime:latest"
TEST_IMAGE = "slimerl/slime-test:latest"


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One run of one test file."""

    path: str
    test_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    timeout: float | None = None  # seconds; None takes the suite's
    # A 0-GPU configuration check that deliberately lives in a GPU suite.
    cpu_only: bool = False
    # CPU cores the file keeps busy itself (its own gloo ranks / spawned processes): the
    # runner starts it only when that many of its job slots are free.
    cores: int = 1
    # False: always a fresh interpreter, never a child of a pre-imported worker (ci/prefork.py).
    prefork: bool = True

    @property
    def id(self) -> str:
        return " ".join((self.path, *self.test_args))


@dataclass(frozen=True, kw_only=True)
class Suite:
    """A named set of entries: one nox session, one CI job (or matrix)."""

    name: str
    tier: Tier
    purpose: str  # one line: what `nox -l` shows
    profile: Profile
    label: str | None = None  # PR label that runs it on GPU runners; None = every event
    image: str | None = None  # Docker image of the GPU tier
    entries: tuple[Entry, ...] = ()
    include: tuple[str, ...] = ()  # rule: NUM_GPUS = 0 test files under these directories
    exclude: tuple[str, ...] = ()
    timeout: float = 900.0  # seconds per entry
    shards: int = 1  # CI matrix width (`--shard I/K`)
    dynamic: bool = False  # entries come from the diff (`changed`), not from here
    # CPU suites fork each pytest file from a worker that imported pytest, numpy, torch and
    # these modules once. Only modules no test stubs in sys.modules before importing them.
    preload: tuple[str, ...] = ()
    prefork: bool = True  # False: every entry starts a fresh interpreter
    # Scheduled cadences (ci/cadences.py) it runs on; None: GPU suites nightly and weekly.
    cadences: tuple[str, ...] | None = None

    # What the tier means everywhere else; the rest of the toolkit asks these, not the tier.
    @property
    def needs_gpus(self) -> bool:
        """GPU tier: GPU machines, the Docker context by default, entries judged as they declare."""
        return self.tier == "gpu"

    @property
    def takes_pytest_args(self) -> bool:
        """CPU tier: every entry is a pytest file, judged by its report; options go to pytest."""
        return self.tier == "cpu"


def _env(**values: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(values.items()))


# The megatron matrix: the RL loop (train.py / train_async.py) end to end on a tiny model,
# on CUDA when present and on CPU ranks under --emulate-gpus. Each entry names the feature
# it proves; each fails when that feature breaks.
MEGATRON_ENTRIES: tuple[Entry, ...] = (
    Entry(path="tests/e2e/test_rl_grpo_colocated.py", timeout=600),
    Entry(path="tests/e2e/test_rl_ppo_critic.py", timeout=600),
    Entry(path="tests/e2e/test_rl_debug_replay.py", timeout=600),
    Entry(path="tests/e2e/test_rl_async.py", timeout=600),
    Entry(path="tests/e2e/test_rl_fanout_filter.py", timeout=600),
    Entry(path="tests/e2e/test_rl_refit_disk.py", timeout=600),
    Entry(path="tests/e2e/test_rl_sleep_wake.py", timeout=600),
    Entry(path="tests/e2e/test_rl_reinforce_tensor_refit.py", timeout=600),
)

# Rollout-engine layouts from `--sglang-config`. The 0-GPU YAML checks run here too, as in the
# original (they also run in cpu_unit, which takes every NUM_GPUS = 0 file under tests/).
SGLANG_CONFIG_ENTRIES: tuple[Entry, ...] = (
    Entry(path="tests/test_sglang_config.py", cpu_only=True, timeout=120),
    Entry(path="tests/e2e/test_sglang_single_node.py", timeout=600),
    Entry(path="tests/e2e/test_sglang_disjoint_groups.py", timeout=600),
    Entry(path="tests/e2e/test_sglang_mixed_offload.py", timeout=600),
    Entry(path="tests/e2e/test_sglang_fault_tolerance.py", timeout=600),
)

# Checkpoint save/load: one file, five optimizer-location combinations, as in the original.
CKPT_ENTRIES: tuple[Entry, ...] = tuple(
    Entry(path="tests/e2e/test_tiny_ckpt.py", test_args=args, timeout=600)
    for args in (
        ("--save-optimizer", "gpu", "--load-optimizer", "gpu"),
        ("--save-optimizer", "gpu", "--load-optimizer", "cpu"),
        ("--save-optimizer", "cpu", "--load-optimizer", "cpu"),
        ("--save-optimizer", "cpu", "--load-optimizer", "gpu"),
        ("--async-save",),
    )
)

PRECISION_ENTRIES: tuple[Entry, ...] = (
    Entry(path="tests/e2e/test_tiny_parallel_check.py", timeout=900),
)

SUITES: tuple[Suite, ...] = (
    Suite(
        name="cpu_unit",
        tier="cpu",
        purpose="CPU correctness tier: every NUM_GPUS = 0 test of slime's core, in parallel",
        profile="cpu",
        include=("tests",),
        exclude=("tests/test_agent", "tests/toolkit", "tests/e2e"),
        timeout=300,  # no file needs more than ~10 s; a hang is cut off early
        # What most files import after torch (measured per file): DTensor and sympy come with
        # slime's loss code (22 and 26 of 58 files, ~1.2 s), the Qwen2 model with the tiny
        # model and the engines (8 files, ~3 s), DCP and FSDP with the trainer (10 files).
        preload=("sympy", "torch.distributed.tensor", "torch.distributed.fsdp",
                 "torch.distributed.checkpoint", "safetensors.torch", "transformers",
                 "transformers.models.qwen2.modeling_qwen2", "tokenizers", "yaml", "psutil"),
    ),
    Suite(
        name="agent_adapter",
        tier="cpu",
        purpose="Agent tier: provider adapters, trajectories and sandbox with real SDK clients",
        profile="agent",
        include=("tests/test_agent",),
        timeout=600,
        preload=("openai", "anthropic", "aiohttp", "httpx"),
    ),
    Suite(
        name="toolkit",
        tier="cpu",
        purpose="The CI toolkit's own tests: registry, runner, GPU lock, changed, workflows",
        profile="dev",
        include=("tests/toolkit",),
        timeout=900,
    ),
    Suite(
        name="sglang_config",
        tier="gpu",
        purpose="GPU tier: rollout-engine deployment configurations",
        profile="e2e",
        label="run-ci-sglang-config",
        image=FRAMEWORK_IMAGE,
        entries=SGLANG_CONFIG_ENTRIES,
    ),
    Suite(
        name="megatron",
        tier="gpu",
        purpose="GPU tier: the core training matrix",
        profile="e2e",
        label="run-ci-megatron",
        image=FRAMEWORK_IMAGE,
        entries=MEGATRON_ENTRIES,
        timeout=3600,
    ),
    Suite(
        name="precision",
        tier="gpu",
        purpose="GPU tier: numerical consistency across parallel layouts",
        profile="e2e",
        label="run-ci-precision",
        image=FRAMEWORK_IMAGE,
        entries=PRECISION_ENTRIES,
    ),
    Suite(
        name="ckpt",
        tier="gpu",
        purpose="GPU tier: checkpoint save/load combinations",
        profile="e2e",
        label="run-ci-ckpt",
        image=FRAMEWORK_IMAGE,
        entries=CKPT_ENTRIES,
    ),
    Suite(
        name="image",
        tier="gpu",
        purpose="GPU tier: the megatron matrix on the test image",
        profile="e2e",
        label="run-ci-image",
        image=TEST_IMAGE,
        entries=MEGATRON_ENTRIES,
        timeout=3600,
        cadences=("weekly",),  # the same matrix as megatron: once a week on the test image
    ),
    Suite(
        name="changed",
        tier="gpu",
        purpose="Test files this branch adds or modifies vs origin/main, each on its NUM_GPUS",
        profile="e2e",
        label="run-ci-changed",
        image=FRAMEWORK_IMAGE,
        dynamic=True,
        timeout=3600,
    ),
)


def by_name() -> dict[str, Suite]:
    return {s.name: s for s in SUITES}
