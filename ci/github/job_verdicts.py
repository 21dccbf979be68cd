"""The jobs of a PR's run, judged from Actions' `toJSON(needs)`: a job that did not succeed is
never passed by default.

The entries' verdicts (ci.history.verdicts) say whose each recorded failure is; they cannot
speak for what was never judged. A cancelled job (by hand, by a newer push, by its time
limit), a job the plan named that was skipped, a job whose result is not one Actions gives,
and a failed job that no failed entry of its own explains, each get a verdict of their own
here, `unknown`, and it blocks whatever the suite's `verdict_blocks` says: a suite may accept
an entry's flake, not a job that never finished. Pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ci.errors import UsageError
from ci.history.verdicts import Verdict
from ci.results import OK_OUTCOMES

# Actions' toJSON(needs) is a few KiB; a larger or deeper value is not one.
MAX_NEEDS_CHARS = 1 << 20
MAX_NEEDS_DEPTH = 8
JOB_RESULTS = ("success", "failure", "cancelled", "skipped")


@dataclass(frozen=True, kw_only=True)
class JobRule:
    """One way a job can fail to speak for its entries: its id and what it means."""

    id: str
    says: str


JOB_RULES: tuple[JobRule, ...] = (
    JobRule(id="job-cancelled",
            says="the job was cancelled (by hand, by a newer push, or at its time limit): what it "
                 "would have judged is untested"),
    JobRule(id="job-stopped",
            says="the job failed, and its run was stopped before it judged every entry "
                 "(an entry of it was interrupted)"),
    JobRule(id="job-unrecorded",
            says="the job failed, and no failed entry of its own is recorded (an install, a check, "
                 "or a job that recorded nothing)"),
    JobRule(id="job-skipped",
            says="the plan named the job for this PR, yet it was skipped"),
    JobRule(id="job-result",
            says="the job's result is none of success, failure, cancelled, skipped"),
    JobRule(id="plan-unread",
            says="the plan job passed, but its list of the jobs this PR runs cannot be read"),
)
_SAYS = {r.id: r.says for r in JOB_RULES}


def _depth(value: object, limit: int) -> int:
    """How deeply lists and objects nest in `value`, counted up to `limit + 1`."""
    stack: list[tuple[object, int]] = [(value, 0)]
    deepest = 0
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            if deepest > limit:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, depth + 1) for c in children)
    return deepest


def parse_needs(raw: str) -> dict[str, object]:
    """Actions' toJSON(needs): an object of job id -> {result, outputs}; bad input is a UsageError."""
    if len(raw) > MAX_NEEDS_CHARS:
        raise UsageError(f"--needs: longer than {MAX_NEEDS_CHARS} characters; pass Actions' toJSON(needs)")
    try:
        needs = json.loads(raw)
    except (ValueError, RecursionError):
        raise UsageError("--needs: not JSON; pass Actions' toJSON(needs)") from None
    if not isinstance(needs, dict):
        raise UsageError("--needs: expected an object of jobs (Actions' toJSON(needs))")
    if _depth(needs, MAX_NEEDS_DEPTH) > MAX_NEEDS_DEPTH:
        raise UsageError(f"--needs: nested deeper than {MAX_NEEDS_DEPTH} levels; pass Actions' toJSON(needs)")
    return needs


def _result(info: object) -> str | None:
    result = info.get("result") if isinstance(info, dict) else None
    return result if isinstance(result, str) else None


def planned(needs: Mapping[str, object], plan_job: str, output: str) -> frozenset[str] | None:
    """The job ids the plan job published, or None when it did not pass or its list is unreadable."""
    info = needs.get(plan_job)
    if _result(info) != "success" or not isinstance(info, dict):
        return None
    outputs = info.get("outputs")
    raw = outputs.get(output) if isinstance(outputs, dict) else None
    try:
        ids = json.loads(raw) if isinstance(raw, str) else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        return None
    return frozenset(ids)


def explains(verdicts: Sequence[Verdict], suite: str) -> tuple[bool, bool]:
    """(a failed entry of the suite was judged, an entry of it was stopped before it was judged).

    Only an entry that failed the job speaks for it: a flake that passed on a retry, a
    quarantined entry, an entry left out by a filter did not make the job fail."""
    mine = [v for v in verdicts if v.suite == suite]
    failed = any(v.outcome not in OK_OUTCOMES and v.outcome != "interrupted" for v in mine)
    stopped = any(v.outcome == "interrupted" for v in mine)
    return failed, stopped


def _verdict(job_id: str, suite: str, rule: str, result: str, detail: str = "") -> Verdict:
    return Verdict(suite=suite, entry_id=f"(job {job_id})", path="", kind="unknown", rule=rule,
                   evidence=_SAYS[rule] + (f"; {detail}" if detail else "") + ": see its log",
                   outcome=result or "no result", reason="", run_uid="", commit="")


def how_it_ended(item: Mapping[str, object]) -> str:
    """How a job of the Actions API's job list ended, from its conclusion and its steps'."""
    conclusion = item.get("conclusion")
    listed = item.get("steps")
    steps = [s for s in listed if isinstance(s, dict)] if isinstance(listed, list) else []
    failed = next((s for s in steps if s.get("conclusion") == "failure"), None)
    if conclusion == "timed_out":
        return "it timed out (ran past its timeout-minutes)"
    if conclusion == "cancelled":
        return "it was cancelled (by hand or by a newer push)"
    if failed is not None:
        return f"its step {str(failed.get('name', '?'))[:80]!r} failed"
    if conclusion == "failure" and any(s.get("status") != "completed" for s in steps):
        return "its runner was lost: steps never completed and none failed"
    return f"its conclusion is {str(conclusion)[:40]!r}"


SHARD_NAME = re.compile(r"\(shard (\d+)\)")


def planned_shards(needs: Mapping[str, object], plan_job: str, output: str) -> dict[str, list[int]]:
    """Each matrix job's shard numbers as the plan job published them (`{"ID": {"shard": [1, 2],
    "of": [2]}}`); {} when it did not pass or the output is unreadable (a push runs no plan)."""
    info = needs.get(plan_job)
    outputs = info.get("outputs") if isinstance(info, dict) and _result(info) == "success" else None
    raw = outputs.get(output) if isinstance(outputs, dict) else None
    try:
        published = json.loads(raw) if isinstance(raw, str) else None
    except (ValueError, RecursionError):
        return {}
    if not isinstance(published, dict):
        return {}
    out = {}
    for job, matrix in published.items():
        shards = matrix.get("shard") if isinstance(matrix, dict) else None
        if isinstance(shards, list) and all(type(i) is int for i in shards):
            out[str(job)] = shards
    return out


def endings(items: Sequence[object], job_ids: Collection[str],
            planned: Mapping[str, Sequence[int]] | None = None) -> dict[str, str]:
    """Job id -> how it ended, from the Actions API's jobs of a run. A matrix job's shards are
    named `ID (shard N)`: each that did not succeed is named, in shard order, so a shard that
    never ran is told apart from the ones that failed their tests; a shard `planned` (the plan
    job's published matrix) that has no job in the run at all is named too."""
    said: dict[str, list[tuple[int, str]]] = {}
    seen: dict[str, set[int]] = {}
    for item in items:
        if not isinstance(item, dict):
            continue
        name = str(item.get("name", ""))
        job, _, rest = (name, "", "") if name in job_ids else name.partition(" (")
        if job not in job_ids:
            continue
        shard = SHARD_NAME.fullmatch("(" + rest) if rest else None
        if shard:
            seen.setdefault(job, set()).add(int(shard[1]))
        if item.get("conclusion") in ("success", "skipped"):
            continue
        how = how_it_ended(item)
        said.setdefault(job, []).append((int(shard[1]), f"shard {shard[1]}: {how}") if shard else (0, how))
    for job, shards in (planned or {}).items():
        if job not in job_ids or job not in seen:  # no leg listed: the job ran no matrix to compare
            continue
        for i in sorted(set(shards) - seen[job]):
            said.setdefault(job, []).append((i, f"shard {i} of {len(shards)}: no job of it in the run "
                                                "(it never started)"))
    return {job: "; ".join(text for _, text in sorted(parts)) for job, parts in said.items()}


def judge_jobs(needs: Mapping[str, object], verdicts: Sequence[Verdict], job_suites: Mapping[str, str], *,
               plan_job: str, plan_output: str, plan_gated: Collection[str],
               ended: Mapping[str, str] | None = None) -> list[Verdict]:
    """A verdict for every job of `needs` that did not succeed and that its entries do not explain.

    `job_suites` maps a job id to the suite (session) its entries are recorded under;
    `plan_gated` are the jobs that run on a PR only when the plan job names them; `ended`, how
    each job ended (`endings`, from the Actions API), is added to its evidence."""
    said = ended or {}
    ran = planned(needs, plan_job, plan_output)
    out = []
    for job_id, info in sorted(needs.items()):
        result = _result(info)
        suite = job_suites.get(job_id, job_id)
        if result == "success":
            if job_id == plan_job and ran is None:
                out.append(_verdict(job_id, suite, "plan-unread", result,
                                    f"its output `{plan_output}` is not a JSON list of job ids"))
            continue
        if result == "skipped":
            # The plan job runs on every pull request; a job it gates runs when it names it. A
            # job no plan gates is skipped by its own `if:` alone (its label, a `labeled` event).
            should = job_id == plan_job or (job_id in plan_gated and ran is not None and job_id in ran)
            if should:
                out.append(_verdict(job_id, suite, "job-skipped", result))
            continue
        if result == "cancelled":
            out.append(_verdict(job_id, suite, "job-cancelled", result, said.get(job_id, "")))
        elif result == "failure":
            failed, stopped = explains(verdicts, suite)
            if stopped:
                out.append(_verdict(job_id, suite, "job-stopped", result, said.get(job_id, "")))
            elif not failed:
                out.append(_verdict(job_id, suite, "job-unrecorded", result, said.get(job_id, "")))
        else:
            shown = repr(result[:40]) if result is not None else "missing"
            out.append(_verdict(job_id, suite, "job-result", result or "", f"its result is {shown}"))
    return out


def rule_table() -> str:
    """The job rules as Markdown (docs/verdicts.md holds a copy; a test keeps them equal)."""
    rows = ["| rule | when |", "|---|---|"]
    rows += [f"| `{r.id}` | {r.says} |" for r in JOB_RULES]
    return "\n".join(rows)
