"""Per job of `python -m ci plan`: the entries a pull request's labelled GPU job runs, and why.

The rule is `ci.select.by_execution` (what each entry executed against what the diff
changed); this module only says which jobs it applies to. A pull request's self-hosted
suite job with a known diff is narrowed; the all-entries label, a push, the schedule and
dispatch run every entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ci.github.job_plan import Decision, Event
from ci.registry.loader import Registry
from ci.select.by_execution import Change
from ci.select.job_entries import JobEntries, everything, for_diff, suite_entries


def entries_by_job(root: Path, registry: Registry, event: Event, decisions: Sequence[Decision],
                   diff: Sequence[Change] | None) -> dict[str, JobEntries]:
    """Job id -> its entries, for each running self-hosted job of a suite with fixed entries."""
    policy = registry.selection
    out: dict[str, JobEntries] = {}
    for d in decisions:
        suite = registry.get(d.job.session)
        if not (d.runs and d.job.kind == "suite" and d.job.self_hosted) or suite is None \
                or suite.dynamic:
            continue
        entries = suite_entries(root, suite, registry.name)
        label = policy.all_entries_label
        if event.name != "pull_request":
            out[d.job.id] = everything((e for e, _ in entries), f"every entry on {event.name}")
        elif any(x.casefold() == label.casefold() for x in event.labels):
            out[d.job.id] = everything((e for e, _ in entries), f"label {label}")
        elif diff is None:
            out[d.job.id] = everything((e for e, _ in entries),
                                       "the diff is unknown (pass --diff BASE or --paths)")
        else:
            out[d.job.id] = for_diff(root, entries, diff, policy)
    return out


def json_fields(chosen: JobEntries | None) -> dict[str, Any]:
    """What `plan --json` adds to a job: its entries and each one's reason."""
    if chosen is None:
        return {}
    return {"selected": chosen.summary(),
            "entries": [{"entry": p.entry, "runs": p.runs, "reason": p.reason} for p in chosen.picks]}
