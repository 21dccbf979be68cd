"""Every generated job's `timeout-minutes`, from its entries' timeouts (a stated formula).

GPU job: SETUP (checkout, install, image pull) + the GPU lock wait + every entry's timeout
in turn (the worst case: each entry waits for the GPUs the one before holds), capped at
MAX. A diff-driven suite's entries are unknown until it runs, so it gets MAX. CPU job:
entries share the runner's cores, so the bound is SETUP plus twice the suite's per-entry
timeout, at least CPU_MINUTES. Until a run-history store can supply measured p95s, these
are the bounds; without them a hung job would hold a runner for Actions' 6-hour default.
"""

from __future__ import annotations

import math

from ci.registry.model import Suite

SETUP_MINUTES = 20
LOCK_WAIT_MINUTES = 30  # what a GPU entry may wait for its GPUs in CI (SLIME_CI_LOCK_TIMEOUT)
CPU_MINUTES = 60
MAX_MINUTES = 360  # a hosted runner's limit; no GPU job should be allowed to hold one longer
LINT_MINUTES = 15
# CI bounds the GPU lock wait by the job's own time through this variable (`python -m ci run`).
LOCK_TIMEOUT_ENV = "SLIME_CI_LOCK_TIMEOUT"


def suite_minutes(suite: Suite) -> int:
    """The job minutes of one suite (see the module docstring)."""
    if not suite.needs_gpus:
        return min(MAX_MINUTES, max(CPU_MINUTES, SETUP_MINUTES + math.ceil(2 * suite.timeout / 60)))
    if suite.dynamic or not suite.entries:
        return MAX_MINUTES
    work = sum(e.timeout if e.timeout is not None else suite.timeout for e in suite.entries)
    return min(MAX_MINUTES, SETUP_MINUTES + LOCK_WAIT_MINUTES + math.ceil(work / 60))
