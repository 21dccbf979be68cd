"""The history schema and its versioned migrations (SQLAlchemy Core, one schema for every dialect)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    inspect,
    text,
    true,
)

metadata = MetaData()

# One row: the schema version this store was migrated to.
meta = Table(
    "slime_ci_meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(256), nullable=False),
)

runs = Table(
    "runs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # Chosen by the writer: recording the same run twice (a replayed spool file, two
    # processes replaying it at once) can never make two rows.
    Column("uid", String(64), nullable=False, unique=True),
    Column("suite", String(128), nullable=False),
    Column("commit", String(64), nullable=False),
    Column("branch", String(256), nullable=False),
    Column("event", String(64), nullable=False),
    Column("host", String(256), nullable=False),
    Column("runner", String(256), nullable=False),
    Column("backend", String(256), nullable=False),
    # The kind of hardware ("cuda", "emulated", "cpu"): estimates and metric baselines
    # never mix kinds.
    Column("hardware", String(64), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float, nullable=False),
    Column("exit_code", Integer, nullable=False),
    # False for a run of a pull request's code (recorded by the trusted ingest job from the
    # PR's spool): it is shown and judged, but never a baseline for gates, quarantine or the
    # monitor. `pr` is the pull request's number where there is one.
    Column("trusted", Boolean, nullable=False, server_default=true()),
    Column("pr", Integer, nullable=True),
    # The GitHub Actions run, its attempt and job that ran it, for links to the evidence
    # ("" and None: a local run, or one recorded before version 6). The run id is text: GitHub's
    # ids outgrew 32 bits.
    Column("gh_run_id", String(32), nullable=False, server_default=""),
    Column("gh_run_attempt", Integer, nullable=True),
    Column("gh_job", String(128), nullable=False, server_default=""),
    Index("runs_by_suite", "suite", "hardware", "started_at"),
    Index("runs_by_branch", "branch", "started_at"),
)

attempts = Table(
    "attempts", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("entry_id", Text, nullable=False),
    Column("path", Text, nullable=False),
    Column("attempt", Integer, nullable=False),  # 1 = first try
    Column("final", Boolean, nullable=False),  # the attempt whose outcome the run reported
    Column("outcome", String(32), nullable=False),
    Column("passed", Integer, nullable=False),
    Column("failed", Integer, nullable=False),
    Column("skipped", Integer, nullable=False),
    Column("num_gpus", Integer, nullable=False),
    Column("devices", String(256), nullable=False),
    Column("node", String(256), nullable=False),
    Column("seconds", Float, nullable=False),
    Column("reason", Text, nullable=False),
    # The attempt's own exit status as the runner saw it (a negative number: killed by that
    # signal); None for attempts recorded before version 3, or that never started a process.
    Column("exit_code", Integer, nullable=True),
    # Where its failure's assertion is, from its JUnit report (ci/history/failure_site.py): a
    # file of the repository and its line; "" and None when it passed, had no report, or was
    # recorded before version 6.
    Column("fail_path", Text, nullable=False, server_default=""),
    Column("fail_line", Integer, nullable=True),
    UniqueConstraint("run_id", "entry_id", "attempt", name="attempt_once"),
    Index("attempts_by_entry", "entry_id"),
)

metrics = Table(
    "metrics", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("entry_id", Text, nullable=False),
    Column("step", Integer, nullable=False),
    Column("name", String(256), nullable=False),
    Column("value", Float, nullable=False),
    UniqueConstraint("run_id", "entry_id", "step", "name", name="metric_once"),
    Index("metrics_by_entry", "entry_id", "name"),
)


# One row per finished bisect (`python -m ci bisect`): the range, the answer and its cost.
# `kind`: first-bad (a commit broke the entry), rate-rose (its flake rate rose there),
# undetermined (budget ran out or skipped commits left more than one candidate), refused.
bisects = Table(
    "bisects", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("uid", String(64), nullable=False, unique=True),
    Column("suite", String(128), nullable=False),
    Column("entry_id", Text, nullable=False),
    Column("good", String(64), nullable=False),
    Column("bad", String(64), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("commit", String(64), nullable=False),  # the answer ("" when there is none)
    Column("candidates", Text, nullable=False),  # space-separated commits it could be
    Column("confidence", Float, nullable=False),  # of one commit's verdict
    Column("attempts_per_commit", Integer, nullable=False),
    Column("width", Integer, nullable=False),  # commits tested at once
    Column("rounds", Integer, nullable=False),
    Column("steps", Integer, nullable=False),  # attempts run, all commits together
    Column("trigger", String(32), nullable=False),  # cli, monitor, comment
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float, nullable=False),
    Column("summary", Text, nullable=False),  # the one-line answer
    Index("bisects_by_entry", "entry_id", "started_at"),
)


# An entry's quarantine lifted by hand (its issue closed by a person, ci/github/flaky_issues.py):
# its flakes before `at` no longer count toward its rate.
lifts = Table(
    "quarantine_lifts", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("suite", String(128), nullable=False),
    Column("entry_id", Text, nullable=False),
    Column("at", Float, nullable=False),
    Column("why", Text, nullable=False),
    UniqueConstraint("suite", "entry_id", "at", name="lift_once"),
)


# What a passing entry of a run executed (`run --record-executed`): one row per entry, its
# files and functions as JSON ({path: [functions]}). Selection reads the newest trusted one.
executed = Table(
    "executed", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("entry_id", Text, nullable=False),
    Column("files", Text, nullable=False),
    # schema 9: the lines it ran, {path: [git blob id, spans]} (ci.select.executed); "{}" before
    Column("lines", Text, nullable=False, server_default="{}"),
    UniqueConstraint("run_id", "entry_id", name="executed_once"),
    Index("executed_by_entry", "entry_id"),
)


# Each job of a finished workflow run, with GitHub's start and end (the ingest job reads the
# run's jobs from the API, ci/history/job_times.py): what a pull request's author waits for is
# its slowest hosted job. Event, PR and trust are the workflow_run event's word.
job_times = Table(
    "job_times", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("gh_run_id", String(32), nullable=False),
    Column("gh_run_attempt", Integer, nullable=False),
    Column("job", String(256), nullable=False),
    Column("event", String(64), nullable=False),
    Column("commit", String(64), nullable=False),
    Column("pr", Integer, nullable=True),
    Column("trusted", Boolean, nullable=False),
    Column("hosted", Boolean, nullable=False),  # a GitHub-hosted runner, not a self-hosted one
    Column("conclusion", String(32), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("completed_at", Float, nullable=False),
    UniqueConstraint("gh_run_id", "gh_run_attempt", "job", name="job_time_once"),
    Index("job_times_by_event", "event", "started_at"),
)


def _v1(conn: Connection) -> None:
    for table in (runs, attempts, metrics):
        table.create(conn, checkfirst=True)


def _v2(conn: Connection) -> None:
    # Stores made at version 2 already have both columns (`runs` is created from the table
    # above); only older stores gain them. Rows from before are trusted: until version 2
    # only the default branch's jobs held the store's credential.
    present = {c["name"] for c in inspect(conn).get_columns("runs")}
    if "trusted" not in present:
        conn.execute(text("ALTER TABLE runs ADD COLUMN trusted BOOLEAN NOT NULL DEFAULT TRUE"))
    if "pr" not in present:
        conn.execute(text("ALTER TABLE runs ADD COLUMN pr INTEGER"))


def _v3(conn: Connection) -> None:
    bisects.create(conn, checkfirst=True)


def _v4(conn: Connection) -> None:
    # The verdict rules (ci/history/verdicts.py) read a signal or the OOM killer from the
    # attempt's own exit status, never from a guess; older attempts keep NULL (no rule fires).
    present = {c["name"] for c in inspect(conn).get_columns("attempts")}
    if "exit_code" not in present:
        conn.execute(text("ALTER TABLE attempts ADD COLUMN exit_code INTEGER"))


def _v5(conn: Connection) -> None:
    lifts.create(conn, checkfirst=True)


def _v6(conn: Connection) -> None:
    # Stores made at version 6 have the columns already; older ones gain them, their rows
    # empty (no failure site, no Actions run known).
    for table, added in (("attempts", (("fail_path", "TEXT NOT NULL DEFAULT ''"), ("fail_line", "INTEGER"))),
                         ("runs", (("gh_run_id", "VARCHAR(32) NOT NULL DEFAULT ''"),
                                   ("gh_run_attempt", "INTEGER"),
                                   ("gh_job", "VARCHAR(128) NOT NULL DEFAULT ''")))):
        present = {c["name"] for c in inspect(conn).get_columns(table)}
        for name, kind in added:
            if name not in present:
                conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {name} {kind}"))


def _v7(conn: Connection) -> None:
    executed.create(conn, checkfirst=True)


def _v8(conn: Connection) -> None:
    job_times.create(conn, checkfirst=True)


def _v9(conn: Connection) -> None:
    # Records made before keep "{}": selection reads them by their functions alone.
    present = {c["name"] for c in inspect(conn).get_columns("executed")}
    if "lines" not in present:
        conn.execute(text("ALTER TABLE executed ADD COLUMN lines TEXT NOT NULL DEFAULT '{}'"))


# (version, what it does, the step). Append only: a store at version N runs N+1… in order.
MIGRATIONS: tuple[tuple[int, str, Callable[[Connection], None]], ...] = (
    (1, "runs, entry attempts and e2e metric series", _v1),
    (2, "runs say whether they ran trusted code (`trusted`) and for which pull request (`pr`)", _v2),
    (3, "bisect answers (`python -m ci bisect`): range, first bad commit or rate rise, cost", _v3),
    (4, "attempts keep their own exit status (`exit_code`: a signal, the OOM killer's kill)", _v4),
    (5, "quarantine lifts: an entry's issue closed by hand forgets its flakes before then", _v5),
    (6, "attempts keep their failure's file and line (`fail_path`, `fail_line`); runs their "
        "Actions run, attempt and job (`gh_run_id`, `gh_run_attempt`, `gh_job`)", _v6),
    (7, "what each passing entry of a run executed (`executed`: its files and functions), "
        "for selection by executed code", _v7),
    (8, "each job of a finished workflow run with GitHub's start and end (`job_times`): the "
        "wait a pull request's author sees", _v8),
    (9, "records of executed code keep the lines each entry ran and the blob they number "
        "(`executed.lines`), for selection by the blocks a change falls in", _v9),
)
LATEST = MIGRATIONS[-1][0]
