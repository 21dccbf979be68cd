"""`python -m ci run --record-executed`: the repository functions each entry executed.

Every Python process an entry starts runs under coverage.py: the entry's own process
finds `COVERAGE_PROCESS_START` in its environment and coverage's `a1_coverage.pth` (shipped
since coverage 7.13) starts measuring before any of its code runs; its children (torchrun
ranks, Ray's raylet and workers, engine servers) inherit the variable and do the same,
and `patch = fork, execv, _exit` keeps what a rank that leaves through `os._exit` or a
forked worker measured. Not `patch = subprocess`: it puts coverage's whole configuration
in `COVERAGE_PROCESS_CONFIG`, which every descendant inherits and coverage's `.pth` obeys
as well, so a process given `COVERAGE_PROCESS_START=""` (a Ray actor's runtime_env) would
still be measured. `COVERAGE_PROCESS_START` alone reaches the same children, and emptying
it turns recording off in a process and everything it starts. Each process writes its own data file
(`parallel`), labelled with the entry's id as a static context (`context =
${SLIME_CI_ENTRY}`): unlike dynamic contexts, a static context works under every core,
sysmon included. When the run ends the files are combined and, per entry that passed,
reduced to {file: functions, lines} (`ci.select.executed`) and stored with the commit. A failed
entry keeps its earlier record: it stopped early and executed less than it would.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from ci.errors import UsageError
from ci.history.run_observer import Hints, Judgement, RunEnd, RunObserver, RunStart
from ci.log import Log
from ci.results import Result
from ci.run import coverage_flush
from ci.select import executed

RCFILE = "coveragerc"
FLUSH_PLUGIN = "slime_ci_coverage_flush"  # ci/run/coverage_flush.py, as the processes import it
MIN_COVERAGE = (7, 13)  # the first release that installs its own startup .pth


def rcfile_text(data_dir: Path, root: Path) -> str:
    """The coverage settings every process of every entry reads (pure)."""
    return "\n".join((
        "[run]",
        f"data_file = {data_dir / 'cov'}",
        "parallel = true",
        "context = ${SLIME_CI_ENTRY}",
        f"source = {root}",
        "patch = fork, execv, _exit",  # not subprocess: see the module's note
        "sigterm = true",
        "disable_warnings = no-data-collected, module-not-measured, no-ctracer",
        f"plugins = {FLUSH_PLUGIN}",
        "",
        f"[{FLUSH_PLUGIN}]",
        f"interval = {coverage_flush.DEFAULT_INTERVAL}",
        "",
    ))


def _check_coverage() -> None:
    try:
        import coverage
    except ImportError:
        raise UsageError("--record-executed needs coverage.py (>= 7.13) where entries run: "
                         "pip install coverage, or install the dev profile") from None
    version = tuple(int(p) for p in re.findall(r"\d+", coverage.__version__)[:2])
    if version < MIN_COVERAGE:
        raise UsageError(f"--record-executed needs coverage >= 7.13 (its startup .pth), found "
                         f"{coverage.__version__}: pip install -U coverage")


def head_commit(root: Path) -> str:
    """The checkout's commit, or "unknown" outside git."""
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def measured_by_entry(data_dir: Path) -> dict[str, dict[str, list[int]]]:
    """Every process's data file combined, then lines per file for each entry's context. Not
    with the entries' rcfile: its flush plugin is importable only on the entries' PYTHONPATH."""
    import coverage

    cov = coverage.Coverage(data_file=str(data_dir / "cov"), config_file=False)
    cov.combine([str(data_dir)], keep=False, strict=False)
    data = cov.get_data()
    out: dict[str, dict[str, list[int]]] = {}
    for context in sorted(data.measured_contexts()):
        if not context:
            continue  # a process started outside any entry
        data.set_query_contexts([f"^{re.escape(context)}$"])
        files = {f: sorted(data.lines(f) or ()) for f in data.measured_files()}
        out[context] = {f: lines for f, lines in files.items() if lines}
    data.set_query_contexts(None)
    return out


def _lines(record: executed.Record) -> dict[str, tuple[str, str]]:
    """A record's lines as a run's result carries them to the history: file -> (blob, spans)."""
    return {f: (record.blobs[f], spans) for f, spans in record.lines.items() if f in record.blobs}


class ExecutedRecorder(RunObserver):
    """Records, per passing entry, what it executed; off unless the run asks for it."""

    def __init__(self) -> None:
        self.on = False
        self.root = Path(".")
        self.data_dir = Path(".")
        self.commit = "unknown"
        self.log: Log | None = None
        self.records: dict[str, executed.Record] | None = None  # by entry, once judged

    def begin(self, start: RunStart) -> Hints:
        if not start.record_executed:
            return Hints()
        _check_coverage()
        self.on, self.root, self.log = True, start.root.resolve(), start.log
        self.commit = head_commit(self.root)
        stamp = f"data-{time.strftime('%Y%m%d-%H%M%S')}-{id(self)}"
        self.data_dir = self.root / ".ci-cache" / "executed" / stamp
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.data_dir.mkdir(parents=True)
        rc = self.data_dir / RCFILE
        rc.write_text(rcfile_text(self.data_dir, self.root), encoding="utf-8")
        shutil.copyfile(Path(coverage_flush.__file__), self.data_dir / f"{FLUSH_PLUGIN}.py")
        path = os.pathsep.join(p for p in (str(self.data_dir), start.env.get("PYTHONPATH", "")) if p)
        return Hints(env={"COVERAGE_PROCESS_START": str(rc), "PYTHONPATH": path})

    def judge(self, judgement: Judgement) -> Judgement:
        """Every entry's processes are over: each passing result gains what it executed, so
        the history records it with the run (and exports it the way runs go)."""
        if not self.on or self.records is not None:
            return judgement
        measured = measured_by_entry(self.data_dir)
        now = time.time()
        self.records = {}
        for r in judgement.results:
            if r.ok:
                got = executed.reduce(self.root, measured.get(r.entry.id, {}))
                self.records[r.entry.id] = executed.Record(
                    entry=r.entry.id, commit=self.commit, recorded_at=now, files=got.files,
                    lines=got.lines, blobs=got.blobs)
        def recorded(r: Result) -> Result:
            record = self.records.get(r.entry.id) if self.records is not None else None
            if record is None:
                return r
            return replace(r, executed=record.files, executed_lines=_lines(record))

        return replace(judgement, results=tuple(recorded(r) for r in judgement.results))

    def run_ended(self, end: RunEnd) -> None:
        if not self.on:
            return
        try:
            if self.records is None:  # not judged (the pipeline calls judge first): judge now
                self.judge(end.judgement)
            self._store(end)
        finally:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _store(self, end: RunEnd) -> None:
        note = self.log.line if self.log is not None else print
        records = list((self.records or {}).values())
        skipped = [f"{r.entry.id} ({r.outcome})" for r in end.judgement.results if not r.ok]
        store = self.root / executed.RECORDS_FILE
        executed.save(store, records)
        note(f"executed code: {len(records)} entr{'y' if len(records) == 1 else 'ies'} recorded "
             f"at {self.commit[:12]} in {store}")
        if skipped:
            note(f"executed code: not recorded (did not pass): {', '.join(skipped)}")


