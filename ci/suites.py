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
# A GPU entry's container privileges (ci/docker_argv.py says what each grants).
Isolation = Literal["minimal", "framework"]
CPU_TIER: Tier = "cpu"
GPU_TIER: Tier = "gpu"
# Install profiles are extras in pyproject.toml; "image" means: use what the Docker image has.
Profile = Literal["cpu", "agent", "e2e", "dev", "lint"]

# What a tier means to GitHub Actions: the labels of its runners, a job's time limit.
GPU_RUNNER_LABELS: tuple[str, ...] = ("self-hosted", "gpu")
JOB_MINUTES: dict[Tier, int] = {"cpu": 60, "gpu": 720}

FRAMEWORK_IMAGE = "slimerl/slime:latest"
TEST_IMAGE = "slimerl/slime-test:latest"


GateRule = Literal["sigma", "relative", "absolute"]


@dataclass(frozen=True, kw_only=True)
class MetricGate:
    """A check of one e2e metric against the trusted history of the same entry and hardware.

    `steps`: "last", "all", or the listed steps. `rule`: "sigma" (within `k` standard
    deviations of the trusted mean, never tighter than `floor`), "relative" (within
    `tolerance` × |mean|), or "absolute" (between `low` and `high`; needs no history).
    """

    metric: str
    steps: Literal["last", "all"] | tuple[int, ...] = "last"
    rule: GateRule = "sigma"
    k: float = 3.0
    floor: float = 0.0
    tolerance: float = 0.1
    low: float | None = None
    high: float | None = None
    min_history: int = 3  # trusted runs needed before a sigma/relative gate judges anything


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
    # Gates on the metrics an e2e entry writes to metrics.jsonl (ci/history/gates.py).
    gates: tuple[MetricGate, ...] = ()
    # Non-empty: why this entry is quarantined. It still runs and is reported QUARANTINED,
    # but does not fail the job (`--include-quarantined` makes it gate again).
    quarantine: str = ""
    # The container's privileges in the Docker context (ci/docker_argv.py): "minimal" unless the
    # entry needs the framework CI's host network, host IPC and --privileged (RDMA, DeepEP).
    container: Isolation = "minimal"

    @property
    def id(self) -> str:
        return " ".join((self.path, *self.test_args))


# The registry's auto-quarantine, for every suite that does not set its own: an entry is
# held once more than 1 in 10 of its recent runs (the last 50) was a flake (failed, then
# passed on a retry, or failed on a commit where it also passed) and it has at least 10
# runs recorded, so one bad afternoon of a new entry is not yet a rate. Without retries
# (the CPU suites) each such flake was a red job for nothing; at more than 1 in 10 people
# learn to re-run red, which costs more than one test that runs but does not gate. A
# consistent failure is not a flake and is never held: it fails the job, and `history
# monitor` reports it. `quarantine_rate=None` on a suite: never held automatically.
AUTO_QUARANTINE_RATE = 0.1
AUTO_QUARANTINE_MIN_RUNS = 10


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
    # Quarantine an entry automatically once its flake rate over the history window is
    # above this (with at least `quarantine_min_runs` runs recorded); None: never.
    quarantine_rate: float | None = AUTO_QUARANTINE_RATE
    quarantine_min_runs: int = AUTO_QUARANTINE_MIN_RUNS
    # Commands its session runs before the suite itself (argv tuples).
    before: tuple[tuple[str, ...], ...] = ()

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


# Metric gates of the megatron entries, judged against the trusted history of the same
# entry on the same kind of hardware (ci/history/gates.py): the reward the run ends on and
# its last gradient norm, and the KL where the entry trains with a KL loss. The floors are
# the smallest drift that counts: emulated runs are bitwise repeatable (σ = 0), so without
# a floor any change at all would fail, and the entries' own checks only ask for a gain.
def _learning_gates(*, kl: bool = False) -> tuple[MetricGate, ...]:
    gates = (MetricGate(metric="rollout/reward", steps="last", k=3.0, floor=0.05),
             MetricGate(metric="train/grad_norm", steps="last", k=3.0, floor=0.25))
    return gates + ((MetricGate(metric="train/kl_loss", steps="last", k=3.0, floor=0.05),) if kl else ())


# The megatron matrix: the RL loop (train.py / train_async.py) end to end on a tiny model,
# on CUDA when present and on CPU ranks under --emulate-gpus. Each entry names the feature
# it proves; each fails when that feature breaks.
MEGATRON_ENTRIES: tuple[Entry, ...] = (
    Entry(path="tests/e2e/test_rl_grpo_colocated.py", timeout=600, gates=_learning_gates(kl=True)),
    Entry(path="tests/e2e/test_rl_ppo_critic.py", timeout=600, gates=_learning_gates()),
    # Its training phase replays recorded rollouts: the reward is the recording's, not learnt.
    Entry(path="tests/e2e/test_rl_debug_replay.py", timeout=600, gates=_learning_gates()[1:]),
    Entry(path="tests/e2e/test_rl_async.py", timeout=600, gates=_learning_gates()),
    Entry(path="tests/e2e/test_rl_fanout_filter.py", timeout=600, gates=_learning_gates()),
    Entry(path="tests/e2e/test_rl_refit_disk.py", timeout=600, gates=_learning_gates()),
    Entry(path="tests/e2e/test_rl_sleep_wake.py", timeout=600, gates=_learning_gates()),
    Entry(path="tests/e2e/test_rl_reinforce_tensor_refit.py", timeout=600, gates=_learning_gates()),
    # The entries that assert learning, again on torch's portable CPU kernels: float rounding
    # differs between the default, AVX2 and AVX-512 kernel sets, and a learning check once
    # held on AVX2 and failed on AVX-512. With the host's own set, each runs under two.
    Entry(path="tests/e2e/test_rl_grpo_colocated.py", test_args=("--cpu-capability", "default"), timeout=600,
          gates=_learning_gates(kl=True)),
    Entry(path="tests/e2e/test_rl_ppo_critic.py", test_args=("--cpu-capability", "default"), timeout=600,
          gates=_learning_gates()),
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

# Planted breaks (`python -m ci plants`, ci/plants.py): patches of the framework under
# PLANTS_DIR/<entry>/<break>.patch, each naming the entry that must catch it and a line of
# the failure. All of them run on the PLANTS_CADENCE; PLANTS_CI, cheap enough for every
# push, also run in `nox -t ci` (tests/toolkit/test_plants.py, in the toolkit suite).
PLANTS_DIR = "tests/e2e/plants"
PLANTS_CADENCE = "nightly"
PLANTS_CI: tuple[str, ...] = (
    "test_fsdp_optimizer_restore/param-groups-not-restored",
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
        before=(("python", "-m", "ci", "audit"),),  # the registry is sound before its tests run
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


# --- sessions that are not suites of test files ------------------------------------------------
# noxfile.py registers one session for each, as it does for every suite, and ci/event_plan.py
# derives their CI jobs: a check on every PR, push and dispatch (`every_event`) or on the
# scheduled cadences it names (ci/cadences.py), a smoke on every PR, push and dispatch.


@dataclass(frozen=True, kw_only=True)
class Check:
    """A session that runs commands rather than test files (workflow checks, lock drift, …)."""

    name: str
    purpose: str  # one line: what `nox -l` shows
    profiles: tuple[str, ...]  # install profiles (pyproject.toml) the session installs
    # Run in order. An argument with `*` is a glob under the checkout (sorted); the session's
    # own arguments follow the last command when `posargs` is set.
    commands: tuple[tuple[str, ...], ...]
    posargs: bool = False
    tags: tuple[str, ...] = ("cpu", "ci")
    every_event: bool = False  # a CI job on every pull request, push to main and dispatch
    cadences: tuple[str, ...] = ()  # a CI job on these scheduled cadences only
    minutes: int = 15  # the CI job's timeout-minutes: a stated bound until history gives one


@dataclass(frozen=True, kw_only=True)
class SmokeRun:
    """What a smoke session runs of one GPU suite: all of it, or the entries `only` matches."""

    suite: str
    only: str | None = None


@dataclass(frozen=True, kw_only=True)
class Smoke:
    """GPU suites' entries on emulated GPUs under real locks: the GPU tier's runner, allocator
    and e2e path exercised on a CPU machine."""

    name: str
    purpose: str
    profiles: tuple[str, ...]
    runs: tuple[SmokeRun, ...]
    gpus: int = 8
    # On the 2-core CI host an emulated entry has, once in a few dozen runs, lost a Ray worker
    # (Ray's SYSTEM_ERROR; what killed it is not known yet, and a failing job now prints the
    # crash lines of the head's worker logs). One rerun; an entry that passes on it is reported
    # FLAKY in the summary table and the JUnit file, never as a plain pass.
    retries: int = 1
    tags: tuple[str, ...] = ("cpu", "ci")
    minutes: int = JOB_MINUTES["cpu"]


# The failure monitor's session: entries failing 3 consecutive runs on main. Its CI job is
# the scheduled `monitor` (ci/event_plan.py, any repository whose schedules map a cron to the
# monitor cadence). Exit 1 (entries failing) fails that job: the alert. A store it cannot
# reach, or none configured, is one line and a pass (--unreachable-ok).
MONITOR_SESSION = "monitor"
MONITOR_REPORT = ".ci-cache/monitor.md"
MONITOR_COMMAND = ("python", "-m", "ci", "history", "monitor", "--out", MONITOR_REPORT, "--unreachable-ok")
MONITOR_PURPOSE = "The failure monitor: entries failing 3 consecutive runs on main, with the range to bisect"

SESSIONS: tuple[Check | Smoke, ...] = (
    Check(name="lint", every_event=True, profiles=("lint",),
          purpose="Generated workflow is current and passes zizmor and the schemas; ruff everywhere, "
                  "mypy on ci/",
          commands=(("python", "-m", "ci", "workflows", "--check"),
                    ("zizmor", "--offline", "--persona", "pedantic", ".github/workflows"),
                    ("check-jsonschema", "--builtin-schema", "vendor.github-workflows",
                     ".github/workflows/*.yml"),
                    ("check-jsonschema", "--builtin-schema", "vendor.compose-spec",
                     "runners/docker-compose.yml"),
                    ("ruff", "check", "."),
                    ("mypy",))),
    # Of ckpt's five optimizer-location combinations the one that crosses devices on both save
    # and load runs here; the label job runs all five.
    Smoke(name="gpu_smoke", profiles=("e2e", "gpu-host"),
          purpose="The GPU tier without GPUs: megatron, precision, one ckpt entry, sglang_config (emulated)",
          runs=(SmokeRun(suite="megatron"), SmokeRun(suite="precision"),
                SmokeRun(suite="ckpt", only="gpu --load-optimizer cpu"), SmokeRun(suite="sglang_config"))),
    Check(name="history", profiles=("history",), tags=(), posargs=True,
          purpose="The run history: show, flaky, monitor; in CI each job's last step records its run "
                  "(`-- record`)",
          commands=(("python", "-m", "ci", "history"),)),
    Check(name=MONITOR_SESSION, profiles=("history",), tags=(), posargs=True, purpose=MONITOR_PURPOSE,
          commands=(MONITOR_COMMAND,)),
    Check(name="mutation", profiles=("mutation",), tags=("nightly",), cadences=("nightly",),
          posargs=True, minutes=240,
          purpose="Mutation score per core module (ci.suites.MUTATION_TARGETS); nightly and on demand, "
                  "not -t ci",
          commands=(("python", "-m", "ci", "mutation"),)),
    Check(name="plants", profiles=("dev", "gpu-host"), tags=("cpu", PLANTS_CADENCE),
          cadences=(PLANTS_CADENCE,), posargs=True, minutes=180,
          purpose="Every planted break (tests/e2e/plants) makes the entry that claims it fail, for its "
                  "reason",
          commands=(("python", "-m", "ci", "plants"),)),
    Check(name="lock_check", profiles=("lock",), tags=("cpu", "weekly"), cadences=("weekly",),
          purpose="The lock files (constraints/) against a fresh resolve of pyproject.toml: fails when "
                  "they are behind",
          commands=(("python", "-m", "ci", "lock", "--check"),)),
)


# --- mutation testing (`nox -s mutation`, nightly and on demand; not part of `nox -t ci`) ----


@dataclass(frozen=True, kw_only=True)
class MutationTarget:
    """A module whose judgement CI depends on, the tests that must notice when it breaks,
    and the share of its mutants they must kill (equivalent mutants not counted)."""

    source: str  # a .py file or a package directory
    tests: tuple[str, ...]  # few and fast: every mutant of a function reruns the tests reaching it
    threshold: float  # killed / (mutants - equivalent), 0..1


# Equivalent mutants (no test can tell them apart), each with its reason; not counted.
MUTATION_EQUIVALENT = "ci/mutation-equivalent.txt"

# Each threshold sits just below the last measured score (README "Mutation testing"), so a
# test that stops catching a break fails the run; raise it as tests improve (aim: 0.9).
# A module measured only in part states the share its measured part proves.
MUTATION_TARGETS: tuple[MutationTarget, ...] = (
    # 100 % (250 of 250; 6 equivalent)
    MutationTarget(source="ci/plan.py", tests=("tests/toolkit/test_plan.py",), threshold=0.98),
    MutationTarget(source="ci/changed.py",
                   tests=("tests/toolkit/test_changed.py", "tests/toolkit/test_changed_affected.py",
                          "tests/toolkit/test_changed_edges.py"),
                   threshold=0.99),  # 100 % (525 of 525; 29 equivalent); 81.6 % before test_changed_edges.py
    MutationTarget(source="ci/gpu_lock.py",
                   tests=("tests/toolkit/test_gpu_lock.py", "tests/toolkit/test_gpu_lock_queue.py",
                          "tests/toolkit/test_gpu_lock_security.py"),
                   threshold=0.96),  # 96.7 % (799 of 826; 50 equivalent); 97.8 % before
    MutationTarget(source="ci/results.py", tests=("tests/toolkit/test_results.py",),
                   threshold=0.98),  # 100 % (372 of 372; 1 equivalent)
    MutationTarget(source="ci/discover.py", tests=("tests/toolkit/test_discover.py",),
                   threshold=0.97),  # 100 % (268 of 268; 15 equivalent)
    # Not test_events.py: it runs the workflow's plan step in a git repository outside the
    # mutated copy, where mutmut's hooks in that child process find no configuration and the
    # run stops before its first mutant.
    MutationTarget(source="ci/event_plan.py",
                   tests=("tests/toolkit/test_triggers.py", "tests/toolkit/test_triggers_rules.py",
                          "tests/toolkit/test_triggers_cli.py", "tests/toolkit/test_triggers_agree.py"),
                   threshold=0.99),  # 100 % (1044 of 1044; 17 equivalent)
    MutationTarget(source="slime/utils/ppo_utils.py",
                   tests=("tests/test_policy_loss.py", "tests/test_cispo_loss.py",
                          "tests/test_grpo_advantages.py", "tests/test_gae.py", "tests/test_ppo_kl.py",
                          "tests/test_masked_whiten.py",
                          "tests/test_discounted_returns.py", "tests/test_reinforce_plus_plus.py",
                          "tests/test_log_probs_entropy.py"),
                   threshold=0.97),  # 99.5 % (415 of 417; 15 equivalent)
    MutationTarget(source="slime/rollout/rm_hub",
                   tests=("tests/test_rm_arith.py", "tests/test_rm_dapo_math.py",
                          "tests/test_rm_deepscaler.py", "tests/test_rm_edges.py", "tests/test_rm_f1.py",
                          "tests/test_rm_gpqa.py", "tests/test_rm_hub_grade.py",
                          "tests/test_rm_math_boxed.py", "tests/test_rm_math_equivalence.py",
                          "tests/test_rm_math_forms.py", "tests/test_rm_math_normalize.py",
                          "tests/utils/test_time_limit.py"),
                   threshold=0.98),  # 99.1 % (855 of 863; 92.6 % before test_rm_edges.py)
)
