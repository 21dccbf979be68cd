"""The trust boundary of the shared history: jobs that run PR code export, a trusted job ingests.

No job that runs a pull request's code holds the shared store's URL. Such a job records its run
in its own SQLite file and exports it (`history record --export DIR`: one JSON file per run,
each marked untrusted) as an artifact. The ingest job (`history-ingest.yml`, on `workflow_run`,
the default branch's code only) downloads those artifacts and records them with
`history ingest DIR --event-file "$GITHUB_EVENT_PATH"`.

The artifact was written by code nobody reviewed, so it is read as hostile: bounded in files
and bytes, each record checked against a strict schema (exact keys, exact types, bounded
strings and numbers, each within its store column), all or nothing: a batch is checked
whole, then written in one transaction. Its trust and its pull request come from GitHub's
event payload and the default branch's commit graph, never from the artifact: a record that
claims to be trusted, or to belong to another pull request, is refused.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ci.errors import UsageError
from ci.history.bisects import record_bisects
from ci.history.on_branch import SHA
from ci.history.rows import (
    MAX_EXECUTED_FILES,
    MAX_EXECUTED_FUNCTIONS,
    MAX_FUNCTION_CHARS,
    MAX_POINTS_PER_ENTRY,
    STEP_MAX,
    AttemptRecord,
    ExecutedRecord,
    RunRecord,
    lines_problem,
)
from ci.history.store import HistoryStore
from ci.results import MetricPoint

EXPORT_DIR = ".ci-cache/history-export"
# What the ingest job hands back to GPU jobs: the trusted runs, as a SQLite file in the Actions
# cache (the default branch's scope, which every PR and dispatch run may read and none write).
SNAPSHOT_KEY = "slime-ci-history-trusted-"
# The same snapshot as an artifact of the ingest job, for `python -m ci history pull` (a laptop).
SNAPSHOT_ARTIFACT = "slime-ci-history-trusted"
SNAPSHOT_RUNS = 300  # per suite and hardware: what a run reads before it plans (record.read_before)
# The comment commands' one-file workflow (ci.github.gateway.RUN_FILE_WORKFLOW, which cannot be
# imported from this layer; a test holds the two equal): every run of it checks out a PR's head.
ONE_FILE_WORKFLOW = "run-ci-file.yml"
# The only workflow file whose runs of the default branch are trusted (ci.github.workflow.
# WORKFLOW_PATH, held equal by a test): another file that takes the same `name:` (any writer
# can push one on a branch or a tag) triggers the ingest too, and is never trusted.
TRUSTED_WORKFLOW = ".github/workflows/pr-test.yml"
# The bisect workflow (ci.github.bisect_workflow.BISECT_PATH, held equal by a test): a dispatch
# of it on the default branch tests only that branch's commits, so its answers (never its runs)
# are recorded; a GPU bisect exports its answer because its runner holds no store URL.
BISECT_WORKFLOW = ".github/workflows/bisect.yml"
BISECT_KINDS = frozenset({"first-bad", "rate-rose", "undetermined", "refused"})
ARTIFACT_PREFIX = "history-"
# What one workflow run may hand to the ingest job.
MAX_FILES = 256
MAX_FILE_BYTES = 8 << 20
MAX_TOTAL_BYTES = 32 << 20
MAX_ATTEMPTS = 5_000
MAX_METRICS = 200_000
# The events whose runs on the default branch of this repository ran reviewed code.
TRUSTED_EVENTS = frozenset({"push", "schedule", "workflow_dispatch"})
# run-ci-file.yml names each run after its pull request (`run-name`); the number is read back here.
RUN_NAME_PR = re.compile(r" for PR #([1-9][0-9]{0,9})\Z")
_UID = re.compile(r"[0-9a-f]{32}")
# The store's INTEGER columns are 32-bit (PostgreSQL's); a record past them is refused here,
# before anything of the batch is written, not by the database halfway through it.
_INT32 = (1 << 31) - 1
# Times a run can have: not before this toolkit existed, not after tomorrow by this clock.
EARLIEST = 1_577_836_800.0  # 2020-01-01 UTC
FUTURE_SLACK = 86_400.0
Warn = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class Trigger:
    """The workflow run whose artifacts are ingested, as GitHub describes it."""

    run_id: int
    workflow: str  # its file, .github/workflows/<name>.yml
    event: str
    trusted: bool
    pr: int | None
    head_sha: str = ""  # the commit it ran; a trusted run's records must name this one
    run_attempt: int | None = None  # the event's `run_attempt`
    doubt: str = ""  # why a run that looked like the default branch's is not trusted
    # A dispatch of our bisect workflow on the default branch (`branch`): its bisect answers
    # are recorded, each of their commits checked to be on that branch.
    bisect: bool = False
    branch: str = ""

    def describe(self) -> str:
        trust = ("trusted" if self.trusted else f"a bisect of {self.branch}" if self.bisect
                 else "untrusted" + (f", PR #{self.pr}" if self.pr else ""))
        return f"{self.workflow} run {self.run_id} ({self.event}, {trust})"


# Whether a commit is on a branch: (sha, branch) -> bool, from the commit graph (ci/history/on_branch.py).
OnBranch = Callable[[str, str], bool]


def _field(data: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise UsageError(f"{where}: `{key}` is missing or not a {kind.__name__}")
    return value


def trigger(payload: Any, *, run_file: str, trusted_workflow: str, on_branch: OnBranch,
            bisect_workflow: str = "") -> Trigger:
    """Trust and pull request of the triggering run, from the `workflow_run` event payload.

    Trusted: a push, schedule or manual run of this repository, by our own workflow file
    (`trusted_workflow`), whose head commit `on_branch` finds on the default branch. The
    branch's name alone proves nothing: a pushed tag named like the branch reports it as
    `head_branch` too. Untrusted: everything else; a pull_request run carries its PR's
    number, and a run of `run_file` (the comment commands' one-file workflow, which checks
    out a PR's head) the number its `run-name` states (the dispatch's `pr` input, checked
    against the PR by its resolve job). A `workflow_dispatch` of `bisect_workflow` of this
    repository on the default branch, its head on that branch, vouches for the bisect answers
    it exports (`Trigger.bisect`); its runs are untrusted like any other file's.
    """
    where = "event file"
    if not isinstance(payload, dict):
        raise UsageError(f"{where}: not a JSON object; pass the workflow_run event ($GITHUB_EVENT_PATH)")
    run = payload.get("workflow_run")
    repo = payload.get("repository")
    if not isinstance(run, dict) or not isinstance(repo, dict):
        raise UsageError(f"{where}: no `workflow_run` and `repository`; pass the workflow_run event "
                         "($GITHUB_EVENT_PATH)")
    run_id = _field(run, "id", int, where)
    workflow = _field(run, "path", str, where)
    event = _field(run, "event", str, where)
    raw_attempt = run.get("run_attempt")
    attempt = (raw_attempt if isinstance(raw_attempt, int) and not isinstance(raw_attempt, bool)
               and 0 < raw_attempt <= 10_000 else None)
    head_branch = run.get("head_branch") or ""
    raw_sha = run.get("head_sha")
    head_sha = raw_sha if isinstance(raw_sha, str) else ""
    head = run.get("head_repository")
    head_repo = head.get("full_name") if isinstance(head, dict) else None
    own = head_repo is not None and head_repo == repo.get("full_name")
    pr: int | None = None
    if Path(workflow).name == run_file:
        title = str(run.get("display_title", ""))
        found = RUN_NAME_PR.findall(title)
        if len(found) != 1 or title.count("for PR #") != 1:
            raise UsageError(f"{where}: a {run_file} run whose name states no single PR "
                             f"({str(run.get('display_title', ''))[:80]!r}); nothing ingested")
        return Trigger(run_id=run_id, workflow=workflow, event=event, trusted=False, pr=int(found[0]),
                       run_attempt=attempt)
    if event in ("pull_request", "pull_request_target"):
        numbers = [p.get("number") for p in run.get("pull_requests") or () if isinstance(p, dict)]
        if len(numbers) == 1 and isinstance(numbers[0], int) and not isinstance(numbers[0], bool):
            pr = numbers[0]
        return Trigger(run_id=run_id, workflow=workflow, event=event, trusted=False, pr=pr,
                       run_attempt=attempt)
    default = repo.get("default_branch")
    if not (event in TRUSTED_EVENTS and own and isinstance(default, str) and default
            and head_branch == default):
        return Trigger(run_id=run_id, workflow=workflow, event=event, trusted=False, pr=None,
                       run_attempt=attempt)
    # It looks like the default branch's own run: now check what the name cannot prove.
    if bisect_workflow and workflow == bisect_workflow and event == "workflow_dispatch":
        vouched = SHA.fullmatch(head_sha) is not None and on_branch(head_sha, default)
        return Trigger(run_id=run_id, workflow=workflow, event=event, trusted=False, pr=None,
                       run_attempt=attempt, bisect=vouched, branch=default if vouched else "",
                       doubt="" if vouched else f"its head {head_sha[:12]!r} is not on {default}")
    doubt = ""
    if workflow != trusted_workflow:
        doubt = f"it ran {workflow[:120]!r}, not our {trusted_workflow}"
    elif not SHA.fullmatch(head_sha):
        doubt = "the event names no head commit (`head_sha`)"
    elif not on_branch(head_sha, default):
        doubt = (f"its head {head_sha[:12]} is not on {default} (a tag or a commit of no branch "
                 f"named {head_branch!r})")
    return Trigger(run_id=run_id, workflow=workflow, event=event, trusted=not doubt, pr=None,
                   head_sha=head_sha if not doubt else "", doubt=doubt, run_attempt=attempt)


# --- the strict schema of an exported record --------------------------------------------------

_STR, _INT, _FLOAT, _BOOL, _OPT_INT, _TIME = "str", "int", "float", "bool", "int|null", "time"
# field: (kind, bound: the longest string, or the largest absolute number)
_RUN: dict[str, tuple[str, float]] = {
    "uid": (_STR, 32), "suite": (_STR, 128), "commit": (_STR, 64), "branch": (_STR, 256),
    "event": (_STR, 64), "host": (_STR, 256), "runner": (_STR, 256), "backend": (_STR, 256),
    "hardware": (_STR, 64), "started_at": (_TIME, 0), "ended_at": (_TIME, 0),
    "exit_code": (_INT, 1 << 16), "trusted": (_BOOL, 0), "pr": (_OPT_INT, _INT32),
    "gh_run_id": (_STR, 20), "gh_run_attempt": (_OPT_INT, 10_000), "gh_job": (_STR, 128),
    "attempts": ("list", MAX_ATTEMPTS), "metrics": ("list", MAX_METRICS),
    "executed": ("list", MAX_ATTEMPTS),  # what each passing entry executed (schema 7)
}
_ATTEMPT: dict[str, tuple[str, float]] = {
    "entry_id": (_STR, 1024), "path": (_STR, 1024), "attempt": (_INT, 1000), "final": (_BOOL, 0),
    "outcome": (_STR, 32), "passed": (_INT, _INT32), "failed": (_INT, _INT32),
    "skipped": (_INT, _INT32), "num_gpus": (_INT, 4096), "devices": (_STR, 256),
    "node": (_STR, 256), "seconds": (_FLOAT, 1e8), "reason": (_STR, 500),
    "exit_code": (_OPT_INT, _INT32),  # the process's own status (schema 4)
    "fail_path": (_STR, 1024), "fail_line": (_OPT_INT, _INT32),  # its failure's site (schema 6)
}
# Keys an exporter older than the key may leave out (a PR branched before it), with their value then.
_ATTEMPT_LATER: dict[str, object] = {"exit_code": None, "fail_path": "", "fail_line": None}
_RUN_LATER: dict[str, object] = {"gh_run_id": "", "gh_run_attempt": None, "gh_job": "",
                                 "executed": []}
_METRIC: dict[str, tuple[str, float]] = {
    "entry_id": (_STR, 1024), "step": (_INT, STEP_MAX), "name": (_STR, 256), "value": (_FLOAT, math.inf),
}


# A bisect answer (`{"bisect": {...}}`, ci.bisect.answer.export_answer): one row of `bisects`.
_BISECT: dict[str, tuple[str, float]] = {
    "uid": (_STR, 32), "suite": (_STR, 128), "entry_id": (_STR, 1024), "good": (_STR, 64),
    "bad": (_STR, 64), "kind": (_STR, 32), "commit": (_STR, 64), "candidates": (_STR, 65 * 1024),
    "confidence": (_FLOAT, 1.0), "attempts_per_commit": (_INT, _INT32), "width": (_INT, _INT32),
    "rounds": (_INT, _INT32), "steps": (_INT, _INT32), "trigger": (_STR, 32),
    "started_at": (_TIME, 0), "ended_at": (_TIME, 0), "summary": (_STR, 2000),
}
# Whether a commit is on the default branch the trigger's bisect ran on.
OnDefault = Callable[[str], bool]


def _text(value: object, bound: float) -> bool:
    """Text every store column takes: no NUL, no lone surrogate (JSON's "\\ud800"), bounded."""
    if not isinstance(value, str) or len(value) > bound or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check(obj: Any, schema: Mapping[str, tuple[str, float]], where: str, *, now: float = math.inf) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is not an object")
    if set(obj) != set(schema):
        extra, missing = sorted(set(obj) - set(schema)), sorted(set(schema) - set(obj))
        raise ValueError(f"{where} has keys it must not ({', '.join(extra) or '-'}) "
                         f"or lacks keys it must have ({', '.join(missing) or '-'})")
    for key, (kind, bound) in schema.items():
        value = obj[key]
        if kind == _STR:
            ok = _text(value, bound)
        elif kind == _TIME:
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
                  and EARLIEST <= value <= now + FUTURE_SLACK)
        elif kind == _BOOL:
            ok = isinstance(value, bool)
        elif kind in (_INT, _OPT_INT):
            ok = ((value is None and kind == _OPT_INT)
                  or (isinstance(value, int) and not isinstance(value, bool) and abs(value) <= bound))
        elif kind == _FLOAT:
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
                  and math.isfinite(value) and abs(value) <= bound)
        else:
            ok = isinstance(value, list) and len(value) <= bound
        if not ok:
            raise ValueError(f"{where}: `{key}` is not a valid {kind}"
                             + (f" of at most {int(bound)}" if kind in (_STR, "list") else "")
                             + (" characters, with no NUL or lone surrogate" if kind == _STR else "")
                             + (" (from 2020 up to tomorrow, in seconds since 1970)" if kind == _TIME
                                else ""))


def _executed(items: list[Any]) -> tuple[ExecutedRecord, ...]:
    """The run's records of executed code, checked: one per entry, names as the store takes
    them, within the bounds of `ci.history.rows`; ValueError says which is wrong."""
    out: list[ExecutedRecord] = []
    seen: set[str] = set()
    for i, x in enumerate(items):
        where = f"executed record {i}"
        if not isinstance(x, dict) or not {"entry_id", "files"} <= set(x) <= {"entry_id", "files", "lines"}:
            raise ValueError(f"{where} is not an object of `entry_id`, `files` and (schema 9) `lines`")
        if not _text(x["entry_id"], 1024) or x["entry_id"] in seen:
            raise ValueError(f"{where}: `entry_id` is not text of at most 1024 characters, or repeats")
        seen.add(x["entry_id"])
        files = x["files"]
        if not isinstance(files, dict) or len(files) > MAX_EXECUTED_FILES:
            raise ValueError(f"{where}: `files` is not an object of at most {MAX_EXECUTED_FILES} files")
        count = 0
        for path, fns in files.items():
            if (not _text(path, MAX_FUNCTION_CHARS) or not isinstance(fns, list)
                    or not all(_text(n, MAX_FUNCTION_CHARS) for n in fns)):
                raise ValueError(f"{where}: {str(path)[:80]!r} is not a file with a list of function "
                                 f"names of at most {MAX_FUNCTION_CHARS} characters")
            count += len(fns)
        if count > MAX_EXECUTED_FUNCTIONS:
            raise ValueError(f"{where}: more than {MAX_EXECUTED_FUNCTIONS} functions")
        lines = x.get("lines", {})
        if (why := lines_problem(lines)) is not None:
            raise ValueError(f"{where}: {why}")
        out.append(ExecutedRecord(entry_id=x["entry_id"], files={p: tuple(f) for p, f in files.items()},
                                  lines={p: (b, s) for p, (b, s) in lines.items()}))
    return tuple(out)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("an object repeats a key")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _load(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def parse_bisect(text: str, *, trigger: Trigger, now: float, on_default: OnDefault) -> dict[str, Any]:
    """One exported bisect answer, checked field by field: only from a dispatch of our bisect
    workflow on the default branch (`trigger.bisect`), and every commit it names (its range,
    its answer, its candidates) on that branch. ValueError says what is wrong."""
    data = _load(text)
    if not isinstance(data, dict) or set(data) != {"bisect"}:
        raise ValueError("not a bisect answer ({\"bisect\": {...}})")
    row = data["bisect"]
    _check(row, _BISECT, "the bisect answer", now=now)
    if not trigger.bisect:
        raise ValueError(f"a bisect answer from {trigger.describe()}: only a dispatch of "
                         f"{BISECT_WORKFLOW} on the default branch records one")
    if not _UID.fullmatch(row["uid"]):
        raise ValueError("the bisect answer: `uid` is not 32 hex digits")
    if row["kind"] not in BISECT_KINDS:
        raise ValueError(f"the bisect answer: `kind` {row['kind'][:32]!r} is not one of "
                         f"{', '.join(sorted(BISECT_KINDS))}")
    if not 0.0 <= row["confidence"] <= 1.0 or min(row[k] for k in ("attempts_per_commit", "width",
                                                                   "rounds", "steps")) < 0:
        raise ValueError("the bisect answer: a confidence outside 0..1 or a negative count")
    named = [row["good"], row["bad"], *([row["commit"]] if row["commit"] else []), *row["candidates"].split()]
    for sha in named:
        if not SHA.fullmatch(sha) or not on_default(sha):
            raise ValueError(f"the bisect answer names {sha[:40]!r}, not a commit of {trigger.branch}")
    return dict(row)


def parse_record(text: str, *, trigger: Trigger, now: float) -> RunRecord:
    """One exported run, checked field by field (times against `now`); ValueError says what
    is wrong. What it returns every store column holds (store.check_record agrees)."""
    data = _load(text)
    if isinstance(data, dict):
        for key, value in _RUN_LATER.items():
            data.setdefault(key, value)
    _check(data, _RUN, "the run", now=now)
    if data["gh_run_id"] and not data["gh_run_id"].isdigit():
        raise ValueError("the run: `gh_run_id` is not an Actions run id (digits)")
    if not _UID.fullmatch(data["uid"]):
        raise ValueError("the run: `uid` is not 32 hex digits")
    if data["trusted"] is not False:
        raise ValueError("the run claims to be trusted; only the ingest job decides that")
    if data["pr"] is not None and data["pr"] != trigger.pr:
        raise ValueError(f"the run claims PR #{data['pr']}, but {trigger.describe()} is "
                         + (f"PR #{trigger.pr}'s" if trigger.pr else "no PR's"))
    if trigger.trusted and data["commit"] != trigger.head_sha:
        raise ValueError(f"the run names commit {data['commit'][:12]!r}, but {trigger.describe()} "
                         f"ran {trigger.head_sha[:12]}: only that commit is vouched for")
    tries = set()
    for i, a in enumerate(data["attempts"]):
        if isinstance(a, dict):
            for key, value in _ATTEMPT_LATER.items():
                a.setdefault(key, value)
        _check(a, _ATTEMPT, f"attempt {i}")
        if (a["entry_id"], a["attempt"]) in tries:
            raise ValueError(f"attempt {i}: attempt {a['attempt']} of {a['entry_id'][:80]!r} is listed twice")
        tries.add((a["entry_id"], a["attempt"]))
    points = set()
    per_entry: dict[str, int] = {}
    for i, m in enumerate(data["metrics"]):
        _check(m, _METRIC, f"metric point {i}")
        per_entry[m["entry_id"]] = per_entry.get(m["entry_id"], 0) + 1
        if per_entry[m["entry_id"]] > MAX_POINTS_PER_ENTRY:
            raise ValueError(f"more than {MAX_POINTS_PER_ENTRY} metric points for one entry")
        if (m["entry_id"], m["step"], m["name"]) in points:
            raise ValueError(f"metric point {i}: step {m['step']} of {m['name'][:80]!r} is listed twice")
        points.add((m["entry_id"], m["step"], m["name"]))
    executed = _executed(data["executed"])
    # Whose run it was is the event's word: trust, pull request and event never come from the file.
    # So is the Actions run it came from, where the event names one (the job is the file's word).
    ran = ({"gh_run_id": str(trigger.run_id), "gh_run_attempt": trigger.run_attempt} if trigger.run_id
           else {"gh_run_id": data["gh_run_id"], "gh_run_attempt": data["gh_run_attempt"]})
    return RunRecord(
        **{k: data[k] for k in _RUN if k not in ("attempts", "metrics", "executed", "trusted", "pr", "event",
                                                 "started_at", "ended_at", "gh_run_id", "gh_run_attempt")},
        **ran,
        started_at=float(data["started_at"]), ended_at=float(data["ended_at"]),
        trusted=trigger.trusted, pr=trigger.pr, event=trigger.event,
        attempts=tuple(AttemptRecord(**{**a, "seconds": float(a["seconds"])}) for a in data["attempts"]),
        metrics=tuple(MetricPoint(entry_id=m["entry_id"], step=m["step"], name=m["name"],
                                  value=float(m["value"])) for m in data["metrics"]),
        executed=executed)


class _Budget:
    """The bounds on what one workflow run hands over: files, bytes a file, bytes in all."""

    def __init__(self) -> None:
        self.files = 0
        self.total = 0

    def take(self, label: str, size: int) -> None:
        self.files += 1
        self.total += size
        if self.files > MAX_FILES:
            raise UsageError(f"ingest: more than {MAX_FILES} files; nothing ingested")
        if size > MAX_FILE_BYTES or self.total > MAX_TOTAL_BYTES:
            raise UsageError(f"ingest: {label} takes the artifacts past {MAX_FILE_BYTES >> 20} MiB a "
                             f"file or {MAX_TOTAL_BYTES >> 20} MiB in all; nothing ingested")


def _zip_members(path: Path, label: str, budget: _Budget) -> list[tuple[str, bytes]]:
    """The records in an artifact's zip, read in memory: never unpacked, so no member's name
    can place a file anywhere; each member's size is bounded as it is read, whatever the
    archive's header says."""
    import lzma
    import zipfile
    import zlib

    out = []
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                where = f"{label}:{info.filename[:80]}"
                if info.is_dir():
                    continue
                stem, dot, ext = info.filename.rpartition(".")
                if not (_UID.fullmatch(stem) and dot and ext == "json"):
                    raise UsageError(f"ingest: {where} is not an exported run (<uid>.json); "
                                     "nothing ingested")
                with archive.open(info) as fh:
                    data = fh.read(MAX_FILE_BYTES + 1)  # what is really there, not what the header says
                budget.take(where, len(data))
                out.append((where, data))
    except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, NotImplementedError,
            zlib.error, lzma.LZMAError) as exc:  # a member whose compressed data is corrupt
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise UsageError(f"ingest: {label} is not a readable zip ({reason}); "
                         "nothing ingested") from None
    return out


@dataclass(frozen=True)
class Batch:
    """What one workflow run handed over, all valid: its runs and its bisect answers."""

    runs: list[RunRecord]
    bisects: list[dict[str, Any]]


def collect(folder: Path, *, trigger: Trigger, now: float) -> list[RunRecord]:
    """The runs of `collect_batch`, where no bisect answer may be (on_default refuses all)."""
    return collect_batch(folder, trigger=trigger, now=now, on_default=lambda sha: False).runs


def collect_batch(folder: Path, *, trigger: Trigger, now: float, on_default: OnDefault) -> Batch:
    """Every record under `folder`, all valid, or a UsageError: the artifacts' zip files as the
    API serves them (read in memory), or folders of `<uid>.json` files. Valid means the
    store takes every one of them (store.check_record), so the batch is written whole. A
    file `{"bisect": {...}}` is a bisect answer (parse_bisect), any other a run."""
    from ci.history.store import RecordRefused, check_record

    if not folder.is_dir():
        return Batch([], [])
    items: list[tuple[str, bytes]] = []
    budget = _Budget()
    for dirpath, dirnames, filenames in os.walk(folder):  # never follows a link to a folder
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            st = path.lstat()
            rel = str(path.relative_to(folder))
            if not stat.S_ISREG(st.st_mode):
                raise UsageError(f"ingest: {rel} is not a plain file; nothing ingested")
            if name.endswith(".zip"):
                if st.st_size > MAX_TOTAL_BYTES:
                    raise UsageError(f"ingest: {rel} is larger than {MAX_TOTAL_BYTES >> 20} MiB; "
                                     "nothing ingested")
                items += _zip_members(path, rel, budget)
            elif name.endswith(".json"):
                budget.take(rel, st.st_size)
                items.append((rel, path.read_bytes()))
            else:
                raise UsageError(f"ingest: {rel} is not an exported run (*.json) or an artifact "
                                 "(*.zip); nothing ingested")
    out: list[RunRecord] = []
    answers: list[dict[str, Any]] = []
    seen: set[str] = set()
    for label, data in items:
        try:
            text = data.decode("utf-8")
            loaded = _load(text)
            if isinstance(loaded, dict) and "bisect" in loaded:
                answer = parse_bisect(text, trigger=trigger, now=now, on_default=on_default)
                uid = str(answer["uid"])
                answers.append(answer)
            else:
                run = parse_record(text, trigger=trigger, now=now)
                check_record(run)  # the columns' own word; parse_record's bounds agree with it
                uid = run.uid
                out.append(run)
        except (ValueError, UnicodeDecodeError, RecordRefused) as exc:
            reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise UsageError(f"ingest: {label}: {reason}; nothing ingested") from None
        if uid in seen:
            raise UsageError(f"ingest: {label}: record {uid} appears twice; nothing ingested")
        seen.add(uid)
    return Batch(out, answers)


def ingest(store: HistoryStore, runs: Sequence[RunRecord]) -> int:
    """Record the runs `collect` checked, all in one transaction; how many were new."""
    return store.record_all(runs)


def ingest_batch(store: HistoryStore, batch: Batch) -> tuple[int, int]:
    """Record a checked batch: its runs in one transaction, then its bisect answers in one;
    how many of each were new."""
    return store.record_all(batch.runs), record_bisects(store, batch.bisects)


def read_event(path: Path) -> Any:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise UsageError(f"--event-file {path}: larger than {MAX_FILE_BYTES >> 20} MiB")
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--event-file {path}: cannot read it as JSON ({str(exc).splitlines()[0]}); "
                         "pass the workflow_run event ($GITHUB_EVENT_PATH)") from None


def export(store: HistoryStore, uids: Sequence[str], folder: Path, warn: Warn) -> int:
    """Write the job's own runs as JSON files for its artifact, each marked untrusted, no PR:
    the job cannot vouch for itself; the ingest job sets both from the event."""
    wanted = set(uids)
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    for run in store.runs():
        if run.uid in wanted:
            (folder / f"{run.uid}.json").write_text(replace(run, trusted=False, pr=None).to_json(),
                                                    encoding="utf-8")
            written += 1
            wanted.discard(run.uid)
    for uid in sorted(wanted):
        warn(f"history: run {uid[:8]} is not in this job's store; not exported")
    return written


def snapshot(store: HistoryStore, out: Path, *, last_runs: int = SNAPSHOT_RUNS) -> int:
    """The newest `last_runs` trusted runs of each suite and hardware, as a fresh SQLite file.

    GPU jobs hold no credential to the shared store; they read their baselines (estimates,
    quarantine, metric gates) from this copy, and record into it before they export.
    """
    from ci.history.store import open_store

    runs = store.runs(trusted_only=True, newest=last_runs)  # oldest first, chosen in SQL
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        with open_store(f"sqlite:///{tmp}") as copy:
            copy.record_all(runs)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return len(runs)

