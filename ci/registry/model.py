"""The registry's schema: what a repository declares its suites and sessions with.

Public: every registry imports these names (`from ci.registry import Entry, Suite`),
this repository's own (`ci.registry.repo_suites`) and every adopter's
(`.slime-ci/suites.py`). A test file's GPU count is never written here: it lives in the
file as `NUM_GPUS = N` and is read by `ci.select.discover`. Rule-based suites take every
test file under their `include` directories (minus `exclude`); GPU suites list their
entries, because the same file may run several times with different arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Tier = Literal["cpu", "gpu"]
# A GPU entry's container privileges (ci/backends/docker_argv.py says what each grants).
Isolation = Literal["minimal", "framework"]
CPU_TIER: Tier = "cpu"
GPU_TIER: Tier = "gpu"
# Install profiles are extras in pyproject.toml; "image" means: use what the Docker image has.
Profile = Literal["cpu", "agent", "e2e", "dev", "lint"]

# What a tier means to GitHub Actions: the labels of its runners, a job's time limit.
GPU_RUNNER_LABELS: tuple[str, ...] = ("self-hosted", "gpu")
JOB_MINUTES: dict[Tier, int] = {"cpu": 60, "gpu": 720}
# The cores of a hosted runner of a public repository (actions-selection-isolation-facts.md):
# what a CPU shard's files share, and so what a suite's shard count is computed for, unless
# the registry's SHARDING says otherwise (a private repository's runner has 2).
HOSTED_CORES = 4
# What a shard job spends before its first test, unless SHARDING says: the job's own steps
# (checkout, setup-python, pip install nox, the caches), the session's venv and the suite's
# `before` step. A stated bound; a registry sets what `benchmarks/pr_feedback.py` measured.
SETUP_SECONDS = 60.0

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
    # False: always a fresh interpreter, never a child of a pre-imported worker (ci/backends/prefork.py).
    prefork: bool = True
    # Gates on the metrics an e2e entry writes to metrics.jsonl (ci/history/metric_gates.py).
    gates: tuple[MetricGate, ...] = ()
    # Non-empty: why this entry is quarantined. It still runs and is reported QUARANTINED,
    # but does not fail the job (`--include-quarantined` makes it gate again).
    quarantine: str = ""
    # The container's privileges in the Docker context (ci/backends/docker_argv.py): "minimal" unless the
    # entry needs the framework CI's host network, host IPC and --privileged (RDMA, DeepEP).
    container: Isolation = "minimal"
    # Who answers for it (a GitHub @user or @org/team); "": the suite's, else CODEOWNERS'. Named
    # in the issue opened when it is quarantined or fails on main (ci/github/flaky_issues.py).
    owner: str = ""

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
# A held entry whose last 10 runs all passed at the first try is let go again, and the issue
# that says it is held closes itself (ci/github/flaky_issues.py).
AUTO_QUARANTINE_CLEAN_RUNS = 10


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
    shards: int = 1  # CI matrix width (`--shard I/K`); above 1 a fixed count, whatever the target
    # The CI job's wall time to aim for, set-up included: the shard count is computed from the
    # measured durations (ci/select/shard_count.py) rather than picked by hand. None: `shards`.
    target_minutes: float | None = None
    dynamic: bool = False  # entries come from the diff (`changed`), not from here
    # CPU suites fork each pytest file from a worker that imported pytest, numpy, torch and
    # these modules once. Only modules no test stubs in sys.modules before importing them.
    preload: tuple[str, ...] = ()
    prefork: bool = True  # False: every entry starts a fresh interpreter
    # Scheduled cadences (ci/registry/cadences.py) it runs on; None: GPU suites nightly and weekly.
    cadences: tuple[str, ...] | None = None
    # Quarantine an entry automatically once its flake rate over the history window is
    # above this (with at least `quarantine_min_runs` runs recorded); None: never.
    quarantine_rate: float | None = AUTO_QUARANTINE_RATE
    quarantine_min_runs: int = AUTO_QUARANTINE_MIN_RUNS
    quarantine_clean_runs: int = AUTO_QUARANTINE_CLEAN_RUNS
    # Commands its session runs before the suite itself (argv tuples).
    before: tuple[tuple[str, ...], ...] = ()
    # The verdicts (ci/history/verdicts.py) that fail the PR's `verdict` check for this suite:
    # by default a new failure and one the history cannot explain; "flaky",
    # "already-failing" and "infrastructure" are listed there and block nothing.
    verdict_blocks: tuple[str, ...] = ("new", "unknown")
    owner: str = ""  # who answers for its entries when an entry names nobody (see Entry.owner)

    # What the tier means everywhere else; the rest of the toolkit asks these, not the tier.
    @property
    def needs_gpus(self) -> bool:
        """GPU tier: GPU machines, the Docker context by default, entries judged as they declare."""
        return self.tier == "gpu"

    @property
    def takes_pytest_args(self) -> bool:
        """CPU tier: every entry is a pytest file, judged by its report; options go to pytest."""
        return self.tier == "cpu"


# --- sessions that are not suites of test files ------------------------------------------------
# noxfile.py registers one session for each, as it does for every suite, and ci/github/job_plan.py
# derives their CI jobs: a check on every PR, push and dispatch (`every_event`) or on the
# scheduled cadences it names (ci/registry/cadences.py), a smoke on every PR, push and dispatch.


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
    """What a smoke session runs of one GPU suite: all of it, or the entries `only` matches
    (one pattern or several: `python -m ci run --only`, glob or substring)."""

    suite: str
    only: str | tuple[str, ...] | None = None

    @property
    def patterns(self) -> tuple[str, ...]:
        if self.only is None:
            return ()
        return (self.only,) if isinstance(self.only, str) else tuple(self.only)


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
    # Empty: a CI job on every pull request, push to main and dispatch; else on these
    # scheduled cadences only (ci/registry/cadences.py), like a Check's.
    cadences: tuple[str, ...] = ()
    minutes: int = JOB_MINUTES["cpu"]
    # As a Suite's: the CI job is split into as many `--shard I/K` jobs as it takes for the
    # slowest to finish within this many minutes, set-up included, by the measured durations
    # of the entries its runs select (ci/select/shard_count.py). `shards` above 1: a fixed count.
    target_minutes: float | None = None
    shards: int = 1
    # Every run records what each entry executed (`smoke --record-executed`, about 1.3x the
    # time): the nightly's records, exported with its runs, are what PR selection reads.
    record_executed: bool = False
    # Its suites' runs one after another instead of at once (`smoke --one-at-a-time`). Four
    # suites recording at once on a 2-core runner drove the load to 79 and engines missed
    # their start; one suite at a time keeps at most a run's own entries (-j) on the cores.
    one_at_a_time: bool = False


# Files that change what entries do without being executed as code (vLLM's CI calls such a
# miss a selection leak): a diff touching one runs every entry of every labelled suite.
DEFAULT_LEAK_PATHS = (
    "pyproject.toml", "constraints/*", "noxfile.py", "conftest.py", "*/conftest.py",
    "ci/registry/repo_suites.py", ".slime-ci/*", "Dockerfile*", "*/Dockerfile*", "*.dockerfile",
)
ALL_ENTRIES_LABEL = "run-ci-all-entries"  # a PR label: its labelled suites run every entry


@dataclass(frozen=True, kw_only=True)
class ShardPolicy:
    """What a suite's or smoke's `target_minutes` is met on (ci/select/shard_count.py): the
    runner its shard jobs get and what each job spends before its first test."""

    runner_cores: int = HOSTED_CORES
    setup_seconds: float = SETUP_SECONDS
    max_shards: int = 8  # no suite is worth more jobs than this: each costs a runner and a set-up


@dataclass(frozen=True, kw_only=True)
class SelectionPolicy:
    """How a PR's labelled GPU suites choose entries by what each executed (ci/select/by_execution.py)."""

    leak_paths: tuple[str, ...] = DEFAULT_LEAK_PATHS  # fnmatch globs; `*` crosses `/`
    # Every file under these directories that is not Python is a leak too (configs, templates).
    non_python_leaks_under: tuple[str, ...] = ("slime",)
    all_entries_label: str = ALL_ENTRIES_LABEL
    recall: float = 1.0  # python -m ci select-audit fails below this share of the plants
    # Under `--record-executed` (coverage.py in every process) each entry's timeout is this many
    # times its own: a ckpt entry of 161 s took over 600 s recorded on a busy 2-core host.
    # An explicit `--timeout` is kept as given.
    recording_timeout_factor: float = 3.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.recall <= 1.0:
            raise ValueError(f"SelectionPolicy(recall={self.recall}): a share, between 0 and 1")
        if self.recording_timeout_factor < 1.0:
            raise ValueError(f"SelectionPolicy(recording_timeout_factor={self.recording_timeout_factor}): "
                             "at least 1 (recording never makes an entry faster)")

# The failure monitor's session: entries failing 3 consecutive runs on main. Its CI job is
# the scheduled `monitor` (ci/github/job_plan.py, any repository whose schedules map a cron to the
# monitor cadence). Exit 1 (entries failing) fails that job: the alert. A store it cannot
# reach, or none configured, is one line and a pass (--unreachable-ok).
MONITOR_SESSION = "monitor"
MONITOR_REPORT = ".ci-cache/monitor.md"
# The streaks the history holds no bisect answer for, one JSON line each: the monitor job's
# next step dispatches a bisect of each (ci/github/bisect_workflow.py).
MONITOR_BISECT_PLAN = ".ci-cache/bisect-plan.jsonl"
MONITOR_COMMAND = ("python", "-m", "ci", "history", "monitor", "--out", MONITOR_REPORT,
                   "--bisect-plan", MONITOR_BISECT_PLAN, "--unreachable-ok")
MONITOR_PURPOSE = "The failure monitor: entries failing 3 consecutive runs on main, with the range to bisect"
# The monitor job also keeps one issue per held or main-breaking entry (ci/github/flaky_issues.py)
# and, from the leak audit it replays, one per entry the selection would miss
# (ci/quality/leak_issues.py); without GITHUB_TOKEN (a laptop) each says so in one line and passes.
ISSUES_COMMAND = ("python", "-m", "ci", "issues", "--unreachable-ok")
LEAK_ISSUES_COMMAND = ("python", "-m", "ci", "select-audit", "--issues", "--unreachable-ok")
# The PR's `verdict` check (ci/github/pr_verdicts.py): the job passes `-- --pr N --base SHA …`.
VERDICT_SESSION = "verdict"
VERDICT_COMMAND = ("python", "-m", "ci", "why")
VERDICT_PURPOSE = "Why each failed entry of a PR failed (new, on main, flaky, infra); the merge gate"
