"""One check run per suite, "slime-ci / <suite>", built from its verdicts; and the calls that
create them through the Checks API.

The sticky comment says everything in one place; a check run puts it where GitHub shows a
suite: the checks list (its conclusion: `failure` when a verdict the suite blocks on is
there, `neutral` when entries failed but none blocks, `success` when none failed) and the
"Files changed" view (an annotation at each failed test's assertion, from the JUnit report's
traceback, else at the test file's first line). The Checks API takes at most 50
annotations a request, further update calls append; a summary holds at most 65,535
characters. Both caps are kept here, and what was left out is said. `build` is pure;
`publish` is the one executor.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ci.github.inert_text import code
from ci.github.rest_client import GitHub
from ci.history.failure_site import Location, junit_locations, parse_report
from ci.history.verdicts import KINDS, Verdict

NAME_PREFIX = "slime-ci / "
ANNOTATIONS_PER_REQUEST = 50  # the Checks API's cap on one create or update call
MAX_ANNOTATIONS = 500  # per check run: ten calls; the summary counts the rest
SUMMARY_LIMIT = 65_535  # `output.summary`, in characters
MESSAGE_LIMIT = 2_000  # one annotation's message, kept short: a reader opens the comment for more
MAX_JUNIT_FILES = 2_000
Conclusion = Literal["success", "failure", "neutral"]
Level = Literal["failure", "warning"]


@dataclass(frozen=True, kw_only=True)
class Annotation:
    path: str
    line: int
    level: Level
    title: str
    message: str

    def payload(self) -> dict[str, Any]:
        return {"path": self.path, "start_line": self.line, "end_line": self.line,
                "annotation_level": self.level, "title": self.title, "message": self.message}


@dataclass(frozen=True, kw_only=True)
class CheckRun:
    """One suite's check run, as it will be created."""

    suite: str
    conclusion: Conclusion
    title: str
    summary: str
    annotations: tuple[Annotation, ...]
    left_out: int  # annotations over MAX_ANNOTATIONS, named in the summary

    @property
    def name(self) -> str:
        return NAME_PREFIX + self.suite

    def preview(self) -> dict[str, Any]:
        """What `why --checks --dry-run --json` prints of it."""
        return {"name": self.name, "conclusion": self.conclusion, "title": self.title,
                "annotations": [{"path": a.path, "line": a.line, "level": a.level, "message": a.message}
                                for a in self.annotations],
                "annotations_left_out": self.left_out, "summary_chars": len(self.summary)}


def read_junit(folder: Path, root: Path) -> dict[str, Location]:
    """The failure locations of every JUnit report under `folder` (bounded; unreadable ones skipped:
    a report a kill cut short says nothing, and the annotation falls back to the file)."""
    out: dict[str, Location] = {}
    if not folder.is_dir():
        return out
    files = sorted(folder.rglob("*.xml"))[:MAX_JUNIT_FILES]
    for f in files:
        doc = parse_report(f)
        if doc is None:
            continue
        for k, v in junit_locations(doc, str(root) + os.sep).items():
            out.setdefault(k, v)
    return out


def conclusion(verdicts: Sequence[Verdict], blocked: Sequence[Verdict]) -> Conclusion:
    if any(v in blocked for v in verdicts):
        return "failure"
    return "neutral" if verdicts else "success"


def recorded_site(v: Verdict) -> Location | None:
    """The failure's site its run recorded (the JUnit report read when the attempt ended)."""
    return Location(path=v.fail_path, line=v.fail_line) if v.fail_path and v.fail_line else None


def _annotation(v: Verdict, blocks: bool, where: Location | None) -> Annotation | None:
    if not v.path:
        return None  # a job's own verdict names no file
    where = where or recorded_site(v)
    line = where.line if where is not None else 1
    path = where.path if where is not None else v.path
    said = where.message if where is not None and where.message else v.reason or v.outcome
    at = "" if where is not None else " (the report gave no line: the file's first)"
    message = f"{v.label} (rule {v.rule}): {said}\n{v.evidence}{at}"
    return Annotation(path=path, line=line, level="failure" if blocks else "warning",
                      title=f"{v.entry_id}: {v.label}"[:255], message=message[:MESSAGE_LIMIT])


def _summary(rows: Sequence[str], left_out: int, head: str) -> str:
    lines = [head, "", "| entry | verdict | evidence | reproduce |", "|---|---|---|---|"]
    tail = [f"{left_out} annotation(s) over {MAX_ANNOTATIONS} were left out; the table names every "
            "entry."] if left_out else []
    kept = 0
    size = sum(len(x) + 1 for x in lines + tail) + 200
    for row in rows:
        if size + len(row) + 1 > SUMMARY_LIMIT:
            break
        lines.append(row)
        size += len(row) + 1
        kept += 1
    if kept < len(rows):
        tail.append(f"{len(rows) - kept} of {len(rows)} rows were left out at GitHub's limit of "
                    f"{SUMMARY_LIMIT:,} characters; `python -m ci why` prints them all.")
    return "\n".join(lines + (["", *tail] if tail else [])) + "\n"


def build(suites: Sequence[str], verdicts: Sequence[Verdict], blocked: Sequence[Verdict], *,
          rows: Mapping[Verdict, str], locations: Mapping[str, Location]) -> list[CheckRun]:
    """A check run for each suite of `suites` (those the run judged) and each suite a verdict names.

    `rows`: each verdict's table row, as the comment renders it; `locations`: per test file,
    where its failure's assertion is (read_junit, `--junit`), else where its run recorded it."""
    out = []
    for suite in sorted(set(suites) | {v.suite for v in verdicts}):
        ours = sorted((v for v in verdicts if v.suite == suite),
                      key=lambda v: (KINDS.index(v.kind), v.entry_id))
        mine = [v for v in ours if v in blocked]
        result = conclusion(ours, mine)
        notes = [a for v in ours if (a := _annotation(v, v in mine, locations.get(v.path))) is not None]
        notes.sort(key=lambda a: a.level != "failure")  # the blocking ones first, when some are cut
        kept, left = tuple(notes[:MAX_ANNOTATIONS]), max(0, len(notes) - MAX_ANNOTATIONS)
        title = ("every recorded entry passed" if not ours else
                 f"{len(mine)} of {len(ours)} failed entries block the merge" if mine else
                 f"{len(ours)} entries did not pass; none blocks")
        head = f"**{result}**: {title}."
        summary = _summary([rows[v] for v in ours], left, head) if ours else head + "\n"
        out.append(CheckRun(suite=suite, conclusion=result, title=title, summary=summary, annotations=kept,
                            left_out=left))
    return out


def requests(run: CheckRun, head_sha: str) -> list[tuple[str, dict[str, Any]]]:
    """The calls that create it: POST with the first 50 annotations, a PATCH for each next 50."""
    chunks = [run.annotations[i:i + ANNOTATIONS_PER_REQUEST]
              for i in range(0, len(run.annotations), ANNOTATIONS_PER_REQUEST)] or [()]

    def output(chunk: Sequence[Annotation]) -> dict[str, Any]:
        return {"title": run.title, "summary": run.summary, "annotations": [a.payload() for a in chunk]}

    first = {"name": run.name, "head_sha": head_sha, "status": "completed", "conclusion": run.conclusion,
             "output": output(chunks[0])}
    return [("POST", first), *(("PATCH", {"output": output(c)}) for c in chunks[1:])]


def publish(gh: GitHub, runs: Sequence[CheckRun], head_sha: str) -> dict[str, str]:
    """Create each check run; its name -> its page (html_url) for the comment's links."""
    links: dict[str, str] = {}
    for run in runs:
        calls = requests(run, head_sha)
        made = gh.call("POST", "/check-runs", calls[0][1])
        ident = int(made["id"]) if isinstance(made, dict) and str(made.get("id", "")).isdigit() else None
        if ident is None:
            continue
        for _, body in calls[1:]:
            gh.call("PATCH", f"/check-runs/{ident}", body)
        url = made.get("html_url") if isinstance(made, dict) else None
        links[run.name] = url if isinstance(url, str) else ""
    return links


def links_line(runs: Sequence[CheckRun], links: Mapping[str, str]) -> str:
    """The comment's line that links each check run (by name alone when it has no page yet)."""
    shown = [f"[{code(r.name, 120, table=False)}]({links[r.name]})" if links.get(r.name)
             else code(r.name, 120, table=False) for r in runs]
    return "Check runs: " + ", ".join(f"{s} ({r.conclusion})" for s, r in zip(shown, runs, strict=True))
