"""Kept for registries written before the registry became a package: a re-export, no code.

An adopted `.slime-ci/suites.py` of an earlier release starts `from ci.suites import Entry,
Suite`; it keeps working. New registries import `ci.registry` (the public schema,
`ci.registry.model`); this repository's own suites are `ci.registry.repo_suites`.
"""

from ci.quality.mutation_targets import MUTATION_EQUIVALENT, MUTATION_TARGETS, MutationTarget
from ci.registry.model import (
    AUTO_QUARANTINE_MIN_RUNS,
    AUTO_QUARANTINE_RATE,
    CPU_TIER,
    FRAMEWORK_IMAGE,
    GPU_RUNNER_LABELS,
    GPU_TIER,
    JOB_MINUTES,
    MONITOR_COMMAND,
    MONITOR_PURPOSE,
    MONITOR_REPORT,
    MONITOR_SESSION,
    TEST_IMAGE,
    Check,
    Entry,
    GateRule,
    Isolation,
    MetricGate,
    Profile,
    Smoke,
    SmokeRun,
    Suite,
    Tier,
)
from ci.registry.repo_suites import (
    CKPT_ENTRIES,
    MEGATRON_ENTRIES,
    PLANTS_CADENCE,
    PLANTS_CI,
    PLANTS_DIR,
    PRECISION_ENTRIES,
    SESSIONS,
    SGLANG_CONFIG_ENTRIES,
    SUITES,
)

__all__ = [
    "AUTO_QUARANTINE_MIN_RUNS", "AUTO_QUARANTINE_RATE", "CKPT_ENTRIES", "CPU_TIER", "FRAMEWORK_IMAGE",
    "GPU_RUNNER_LABELS", "GPU_TIER", "JOB_MINUTES", "MEGATRON_ENTRIES", "MONITOR_COMMAND",
    "MONITOR_PURPOSE", "MONITOR_REPORT", "MONITOR_SESSION", "MUTATION_EQUIVALENT", "MUTATION_TARGETS",
    "PLANTS_CADENCE", "PLANTS_CI", "PLANTS_DIR", "PRECISION_ENTRIES", "SESSIONS", "SGLANG_CONFIG_ENTRIES",
    "SUITES", "TEST_IMAGE", "Check", "Entry", "GateRule", "Isolation", "MetricGate", "MutationTarget",
    "Profile", "Smoke", "SmokeRun", "Suite", "Tier",
]
