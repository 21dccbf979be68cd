"""The registry: what a repository declares (suites, entries, sessions) and how it is loaded.

`from ci.registry import Entry, Suite` is the public schema every registry imports
(`ci.registry.model`); `load_registry(root)` reads a checkout's registry (`ci.registry.loader`).
Also here: this repository's own suites as data (`repo_suites`), install profiles and their
constraints files, cadences, the workflow style an adopter declares, job timeouts, and the
list of `U`'s generated files.
"""

from ci.registry.loader import Registry, load_registry
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
    VERDICT_SESSION,
    Check,
    Entry,
    Isolation,
    MetricGate,
    Profile,
    SelectionPolicy,
    ShardPolicy,
    Smoke,
    SmokeRun,
    Suite,
    Tier,
)

__all__ = [
    "AUTO_QUARANTINE_MIN_RUNS", "AUTO_QUARANTINE_RATE", "CPU_TIER", "FRAMEWORK_IMAGE", "GPU_RUNNER_LABELS",
    "GPU_TIER", "JOB_MINUTES", "MONITOR_COMMAND", "MONITOR_PURPOSE", "MONITOR_REPORT", "MONITOR_SESSION",
    "TEST_IMAGE", "VERDICT_SESSION", "Check", "Entry", "Isolation", "MetricGate", "Profile", "Registry",
    "SelectionPolicy", "ShardPolicy", "Smoke", "SmokeRun", "Suite", "Tier", "load_registry",
]
