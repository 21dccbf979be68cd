"""This repository's suites and sessions, as data: the registry of the `slime/` workload.

Declared with the public schema (`ci.registry.model`); `ci.select.entries` resolves it.
An adopting repository's registry is `.slime-ci/suites.py` in its own tree, in the same form.
"""

from __future__ import annotations

from ci.registry.model import (
    FRAMEWORK_IMAGE,
    ISSUES_COMMAND,
    LEAK_ISSUES_COMMAND,
    MONITOR_COMMAND,
    MONITOR_PURPOSE,
    MONITOR_SESSION,
    TEST_IMAGE,
    VERDICT_COMMAND,
    VERDICT_PURPOSE,
    VERDICT_SESSION,
    Check,
    Entry,
    MetricGate,
    ShardPolicy,
    Smoke,
    SmokeRun,
    Suite,
)


def _env(**values: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(values.items()))


# Metric gates of the megatron entries, judged against the trusted history of the same
# entry on the same kind of hardware (ci/history/metric_gates.py): the reward the run ends on and
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
# Each trains under a warm-up and cosine lr decay with weight decay and saves mid-schedule
# (the schedule is in the test file), so a resume that loses Adam's moments, the param groups
# or the scheduler's step fails every one of them (tests/e2e/plants/test_tiny_ckpt/).
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

# Planted breaks (`python -m ci plants`, ci/quality/plants.py): patches of the framework under
# PLANTS_DIR/<entry>/<break>.patch, each naming the entry that must catch it and a line of
# the failure. All of them run on the PLANTS_CADENCE; PLANTS_CI, cheap enough for every
# push, also run in `nox -t ci` (tests/toolkit/quality/test_plants.py, in the toolkit suite).
PLANTS_DIR = "tests/e2e/plants"
PLANTS_CADENCE = "nightly"
PLANTS_CI: tuple[str, ...] = (
    "test_fsdp_optimizer_restore/param-groups-not-restored",
)

# The shard counts of the targets below are sized for a 2-core runner: the CI machine that
# runs `.ci/run` has 2, as a private fork's hosted runner does (a public repository's has 4),
# so a count that meets its target here meets it there too, at the price of more set-ups.
# The 60 s set-up is a bound for a hosted runner (its start, checkout, Python, a torch
# download); `benchmarks/pr_feedback.py` measured 4 s warm and 11 s cold for the clone and the
# install alone here (docs/benchmarks.md, PR feedback).
SHARDING = ShardPolicy(runner_cores=2, setup_seconds=60.0)

SUITES: tuple[Suite, ...] = (
    Suite(
        name="cpu_unit",
        tier="cpu",
        purpose="CPU correctness tier: every NUM_GPUS = 0 test of slime's core, in parallel",
        profile="cpu",
        include=("tests",),
        exclude=("tests/test_agent", "tests/toolkit", "tests/e2e"),
        timeout=300,  # no file needs more than ~10 s; a hang is cut off early
        # What many files import after torch: DTensor and sympy come with slime's loss code,
        # the Qwen2 model with the tiny model and the engines, DCP and FSDP with the trainer.
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
        # The slowest job of a PR: split by its measured durations (ci/select/shard_count.py).
        target_minutes=7,
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


# What gpu_smoke runs on every push (the rest of each suite runs in gpu_smoke_nightly).
_SMOKE_ON_PUSH: tuple[SmokeRun, ...] = (
    # Colocated GRPO with KL (engines sleep, weights refit over tensors) and the 8-GPU
    # fan-out; asynchronous training and the disk refit run nightly.
    SmokeRun(suite="megatron", only=("tests/e2e/test_rl_grpo_colocated.py",
                                     "tests/e2e/test_rl_fanout_filter.py")),
    # Of ckpt's five optimizer-location combinations, the one that crosses devices on both
    # save and load.
    SmokeRun(suite="ckpt", only="gpu --load-optimizer cpu"),
    # The YAML checks and disjoint engine groups (several engines, each started and served);
    # the single-engine layout runs nightly.
    SmokeRun(suite="sglang_config", only=("tests/test_sglang_config.py",
                                          "tests/e2e/test_sglang_disjoint_groups.py")),
)
_GPU_ENTRIES = {"megatron": MEGATRON_ENTRIES, "precision": PRECISION_ENTRIES, "ckpt": CKPT_ENTRIES,
                "sglang_config": SGLANG_CONFIG_ENTRIES}
_SMOKE_ON_PUSH_NAMES = tuple(f"{len(run.patterns)} of {len(_GPU_ENTRIES[run.suite])} {run.suite}"
                             for run in _SMOKE_ON_PUSH)

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
    # On every push, the GPU tier on emulated GPUs is a stated subset (_SMOKE_ON_PUSH: colocated
    # GRPO with KL, the 8-GPU fan-out, the cross-device checkpoint, disjoint engine groups and
    # the YAML checks); gpu_smoke_nightly runs every entry of the four suites every night, and
    # their label jobs run them on GPUs. Each moved entry's planted breaks still run in
    # `plants` (nightly).
    Smoke(name="gpu_smoke", profiles=("e2e", "gpu-host"),
          purpose="The GPU tier without GPUs, on every push: " + ", ".join(_SMOKE_ON_PUSH_NAMES)
                  + " entries (emulated); precision and the rest nightly (gpu_smoke_nightly)",
          runs=_SMOKE_ON_PUSH, target_minutes=7),
    # It records what each entry executed (record_executed): its runs, ingested as main's, are
    # what a PR's GPU jobs select from (docs/selection.md). Recorded entries get
    # SelectionPolicy.recording_timeout_factor times their timeouts. Its suites run one at a
    # time: recording all four at once overloaded a 2-core runner (load 79, engines late).
    Smoke(name="gpu_smoke_nightly", profiles=("e2e", "gpu-host"), tags=("cpu", "nightly"),
          cadences=("nightly",), minutes=150, record_executed=True, one_at_a_time=True,
          purpose="Every entry of megatron, precision, ckpt and sglang_config on emulated GPUs, nightly "
                  "(gpu_smoke runs a subset on every push)",
          runs=(SmokeRun(suite="megatron"), SmokeRun(suite="precision"), SmokeRun(suite="ckpt"),
                SmokeRun(suite="sglang_config"))),
    Check(name="history", profiles=("history",), tags=(), posargs=True,
          purpose="The run history: show, flaky, monitor; in CI each job's last step records its run "
                  "(`-- record`)",
          commands=(("python", "-m", "ci", "history"),)),
    # Built and published by the monitor's cadence (ci/github/pages_workflow.py), not a job of its own.
    Check(name="hud", profiles=("history",), tags=(), posargs=True,
          purpose="The HUD: the run history as a static site (`-- --out DIR`); GitHub Pages hourly",
          commands=(("python", "-m", "ci", "hud"),)),
    Check(name=MONITOR_SESSION, profiles=("history",), tags=(), posargs=True, purpose=MONITOR_PURPOSE,
          commands=(ISSUES_COMMAND, LEAK_ISSUES_COMMAND, MONITOR_COMMAND)),
    Check(name=VERDICT_SESSION, profiles=("history",), tags=(), posargs=True, purpose=VERDICT_PURPOSE,
          commands=(VERDICT_COMMAND,)),
    Check(name="actions", profiles=("actions",), tags=(), posargs=True,
          purpose="The generated workflows for one event, run by act on this host "
                  "(`-- pull_request --labels run-ci-megatron`): jobs, commands, GitHub requests",
          commands=(("python", "-m", "ci", "actions"),)),
    # One PR through act with the ckpt job's real session on emulated GPUs and a planted break,
    # into the verdict comment: minutes, so nightly; the toolkit suite deselects `nightly` tests.
    Check(name="actions_real", profiles=("dev",), tags=("nightly",), cadences=("nightly",), minutes=45,
          purpose="A PR through act with the ckpt job run for real on emulated GPUs (a planted break) into "
                  "the verdict comment; nightly",
          commands=(("python", "-m", "pytest", "-m", "nightly",
                     "tests/toolkit/actions/test_actions_real.py"),)),
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
