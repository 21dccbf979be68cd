"""The answer of `python -m ci actions`: one table (or JSON) of jobs, commands and requests."""

from __future__ import annotations

from typing import Any

from ci.actions.harness import Outcome
from ci.actions.job_runs import JobRun

_BODY_CHARS = 120


def as_json(outcome: Outcome) -> dict[str, Any]:
    """{"jobs": [...], "requests": [...], "notes", "findings", "seconds"} (pure)."""
    return {
        "jobs": [{"workflow": j.workflow, "job": j.job, "status": j.status, "result": j.result,
                  "why": j.why, "real": j.real, "commands": list(j.commands)} for j in outcome.jobs],
        "requests": [{"method": r["method"], "path": r["path"], "body": r["body"]} for r in outcome.requests],
        "notes": list(outcome.notes),
        "findings": list(outcome.findings),
        "plan_disagrees": None if outcome.disagreements is None else list(outcome.disagreements),
        "seconds": round(outcome.seconds, 1),
    }


def _short(body: Any) -> str:
    text = str(body) if body else ""
    return text if len(text) <= _BODY_CHARS else text[:_BODY_CHARS - 1] + "…"


def _depth(job: JobRun) -> str:
    """How the job's nox ran: its real sessions, the recording stand-in, or not at all."""
    if job.status != "ran":
        return "-"
    return "real" if job.real else "recorded"


def render(outcome: Outcome) -> str:
    """The table: workflow, job, ran or skipped, result, how its nox ran (real or recorded), why it
    was skipped; then each job's commands."""
    rows = [("workflow", "job", "status", "result", "nox", "why")]
    rows += [(j.workflow, j.job, j.status, j.result, _depth(j), j.why) for j in outcome.jobs]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5] for r in rows]
    lines += ["", "commands (run: steps, as the recording nox, gh and python saw them):"]
    for j in outcome.jobs:
        for command in j.commands:
            lines.append(f"  {j.workflow} {j.job}: {command}")
    lines += ["", f"GitHub REST requests (loopback stand-in): {len(outcome.requests)}"]
    lines += [f"  {r['method']} {r['path']} {_short(r['body'])}".rstrip() for r in outcome.requests]
    lines += ["", "what the harness did that act does not:"]
    lines += [f"  {n}" for n in outcome.notes]
    lines += ["", "keys act ignores, checked statically: "
              + ("all set" if not outcome.findings else f"{len(outcome.findings)} problem(s)")]
    lines += [f"  {f}" for f in outcome.findings]
    if outcome.disagreements is not None:
        lines += ["", "python -m ci plan for this event: "
                  + ("the same jobs and commands" if not outcome.disagreements else "DISAGREES")]
        lines += [f"  {d}" for d in outcome.disagreements]
    ran = sum(j.status == "ran" for j in outcome.jobs)
    lines += ["", f"{ran} of {len(outcome.jobs)} jobs ran in {outcome.seconds:.1f} s"]
    return "\n".join(lines)
