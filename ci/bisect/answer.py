"""The bisect's answer: the lines it prints, the step summary, the history row, the issue body."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.bisect.driver import Commit, Outcome, StepPlan
from ci.bisect.search import confidence_of

# The marker of the streak's issue (the broken-main issue of an entry): whoever posts the
# body below finds or opens the issue carrying it.
ISSUE_MARKER = "<!-- slime-ci:entry={entry} kind=broken-main -->"



@dataclass(frozen=True, kw_only=True)
class Answer:
    """Everything a reader of the verdict needs, built once from the search's outcome."""

    suite: str
    entry: str
    commits: tuple[Commit, ...]
    outcome: Outcome
    plan: StepPlan
    rate: float  # the flake rate k was chosen from
    confidence: float  # asked for
    trigger: str
    started_at: float

    @property
    def k(self) -> int:
        return self.outcome.search.k

    @property
    def kind(self) -> str:
        return "refused" if self.outcome.refusal else self.outcome.verdict.kind

    @property
    def commit(self) -> Commit | None:
        index = self.outcome.verdict.index
        return self.commits[index] if index is not None and not self.outcome.refusal else None

    @property
    def reached(self) -> float:
        """The confidence each commit's verdict holds with, at the k that was run."""
        return confidence_of(self.rate, self.k)

    def headline(self) -> str:
        """The answer in one line."""
        v = self.outcome.verdict
        if self.outcome.refusal:
            return f"refused: {self.outcome.refusal}"
        if v.kind == "undetermined":
            lo, hi = self.commits[v.lo], self.commits[v.hi]
            why = self.outcome.stopped or v.why
            return (f"undetermined: the first bad commit lies after {lo.short()} and at or before "
                    f"{hi.short()} ({len(v.candidates)} commits); {why}")
        sure = (f" (each verdict at {self.reached:.0%} confidence, {self.k} attempts per commit)"
                if self.k > 1 else "")
        if self.commit is None:
            names = ", ".join(self.commits[i].short() for i in v.candidates)
            return f"first bad commit is one of {names}: {v.why}{sure}"
        if v.kind == "rate-rose":
            obs = self.outcome.search.seen
            before = obs[v.lo].describe()
            after = obs[v.hi].describe()
            return (f"flake rate rose at commit {self.commit.describe()}: {before} at "
                    f"{self.commits[v.lo].short()}, {after} there{sure}")
        return f"first bad commit: {self.commit.describe()}{sure}"

    def reproduce(self) -> str:
        v = self.outcome.verdict
        if self.commit is not None:
            return self.plan.reproduce(self.commit.sha)
        lo, hi = self.commits[v.lo].sha, self.commits[v.hi].sha
        return (f"python -m ci bisect --suite {self.suite} --entry '{self.entry}' --good {lo[:12]} "
                f"--bad {hi[:12]}" + (" --emulate-gpus" if self.plan.emulate else ""))

    def rows(self) -> list[tuple[str, ...]]:
        """One row per tested commit, in range order."""
        search = self.outcome.search
        seconds: dict[int, float] = {}
        for a in self.outcome.attempts:
            seconds[a.index] = seconds.get(a.index, 0.0) + a.seconds
        round_of = {i: str(n) for n, batch in enumerate(search.rounds, 1) for i in batch}
        out: list[tuple[str, ...]] = []
        for i, obs in sorted(search.seen.items()):
            c = self.commits[i]
            end = " (good end)" if i == 0 else " (bad end)" if i == len(self.commits) - 1 else ""
            out.append((round_of.get(i, "-"), c.short(), (c.subject[:48] + end), obs.describe(),
                        f"{seconds.get(i, 0.0):.1f}s"))
        return out


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=False)]

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()

    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)])


HEAD = ("round", "commit", "subject", "outcome", "time")


def text(answer: Answer) -> str:
    """What the command prints at the end."""
    o = answer.outcome
    steps = sum(1 for a in o.attempts)
    lines = ["", table(HEAD, answer.rows()), "",
             answer.headline(),
             f"{len(o.search.rounds)} round(s), {steps} attempt(s), {answer.outcome.search.width} "
             f"at once, {o.wall:.1f}s",
             f"reproduce: {answer.reproduce()}"]
    return "\n".join(lines)


def _cell(value: str) -> str:
    return value.replace("|", "\\|")


def markdown(answer: Answer) -> str:
    """The step summary, and the body for the streak's issue."""
    o = answer.outcome
    rows = ["| round | commit | subject | outcome | time |", "|---:|---|---|---|---:|"]
    rows += [f"| {r} | `{c}` | {_cell(s)} | {out} | {t} |" for r, c, s, out, t in answer.rows()]
    return "\n".join([
        f"### Bisect of `{answer.entry}` ({answer.suite})", "",
        f"**{answer.headline()}**", "",
        f"Range `{answer.commits[0].short()}..{answer.commits[-1].short()}` "
        f"({len(answer.commits) - 1} commits), {len(o.search.rounds)} round(s), "
        f"{o.search.width} commit(s) at once, {len(o.attempts)} attempt(s) in {o.wall:.0f}s.", "",
        *rows, "",
        f"Reproduce: `{answer.reproduce()}`"])


def answer_row(answer: Answer, *, ended_at: float) -> dict[str, object]:
    """The answer as one row of the history's `bisects` table (schema version 3)."""
    v = answer.outcome.verdict
    commit = answer.commit
    return {"uid": uuid.uuid4().hex, "suite": answer.suite, "entry_id": answer.entry,
            "good": answer.commits[0].sha, "bad": answer.commits[-1].sha, "kind": answer.kind,
            "commit": commit.sha if commit else "",
            "candidates": " ".join(answer.commits[i].sha for i in v.candidates),
            "confidence": answer.reached, "attempts_per_commit": answer.k,
            "width": answer.outcome.search.width, "rounds": len(answer.outcome.search.rounds),
            "steps": len(answer.outcome.attempts), "trigger": answer.trigger,
            "started_at": answer.started_at, "ended_at": ended_at, "summary": answer.headline()}


def record_answer(url: str, answer: Answer) -> None:
    """Write the answer as one row of the history's `bisects` table."""
    from ci.history.bisects import record_bisects
    from ci.history.store import open_store

    with open_store(url) as store:
        record_bisects(store, [answer_row(answer, ended_at=time.time())])


def export_answer(answer: Answer, folder: Path) -> Path:
    """The answer as FOLDER/<uid>.json (`{"bisect": row}`), for the ingest job: a bisect on a
    GPU runner holds no store URL, so its artifact carries the answer to the shared store
    like every other GPU result (ci/history/ingest.py checks it and the run that made it)."""
    row = answer_row(answer, ended_at=time.time())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{row['uid']}.json"
    path.write_text(json.dumps({"bisect": row}, indent=1) + "\n", encoding="utf-8")
    return path


def post_to_streak_issue(answer: Answer, folder: Path) -> Path:
    """Where the answer goes to the streak's issue: the body, with the issue's marker, written to
    FOLDER/<entry>.md beside a JSON of the verdict. The issue itself is opened or
    updated by whatever posts broken-main issues; until one does, this file is the hand-off
    (the bisect job uploads it, and its step summary shows the same text)."""
    folder.mkdir(parents=True, exist_ok=True)
    slug = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in answer.entry)[:120]
    body = ISSUE_MARKER.format(entry=answer.entry) + "\n" + markdown(answer) + "\n"
    path = folder / f"{slug}.md"
    path.write_text(body, encoding="utf-8")
    commit = answer.commit
    (folder / f"{slug}.json").write_text(json.dumps({
        "entry": answer.entry, "suite": answer.suite, "kind": answer.kind,
        "commit": commit.sha if commit else None, "pr": commit.pr if commit else None,
        "headline": answer.headline(), "reproduce": answer.reproduce()}, indent=1) + "\n",
        encoding="utf-8")
    return path
