"""The history store: where runs are written and read back. SQLite by default, PostgreSQL shared.

Every run writes in one transaction; a run's `uid` is unique, so recording it again
(a spooled record replayed by two processes at once) is a no-op, never a duplicate.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ci.errors import StoreError, UsageError
from ci.history.rows import RunRecord, lines_json, lines_of, lines_problem

# `schema` (SQLAlchemy tables) is imported inside the methods that use a store, so the
# toolkit without the `history` extra (an adopter's plain install) still imports this module.

HISTORY_ENV = "SLIME_CI_HISTORY_URL"
HISTORY_FILE = ".ci-cache/history.sqlite"
# In the generated workflows: the repository secret holding the shared store's URL, the
# GitHub environment it lives in, and the nox session that records a job's run.
HISTORY_SECRET = HISTORY_ENV
HISTORY_ENVIRONMENT = "ci-history"
HISTORY_SESSION = "history"
OFF = ("off", "none", "0")
# Any constant: the key of PostgreSQL's advisory lock that serialises migrations.
_MIGRATION_LOCK = 0x51_1CE_C1
_SQLITE_WAIT_S = 60.0


# The columns of a run row, as RunRecord names them.
_RUN_FIELDS = ("uid", "suite", "commit", "branch", "event", "host", "runner", "backend", "hardware",
               "started_at", "ended_at", "exit_code", "trusted", "pr", "gh_run_id", "gh_run_attempt",
               "gh_job")


def default_url(root: Path) -> str:
    return f"sqlite:///{root / HISTORY_FILE}"


def resolve_url(cli: str | None, env: Mapping[str, str], root: Path) -> str | None:
    """The store this command uses: --history, else SLIME_CI_HISTORY_URL, else the SQLite file.

    None means recording is off (`--history off`). A URL that cannot be a store is a
    UsageError (exit 2) before anything runs.
    """
    raw = (cli if cli is not None else env.get(HISTORY_ENV, "")).strip()
    if raw.lower() in OFF:
        return None
    if not raw:
        return default_url(root)
    return normalise(raw)


def normalise(raw: str) -> str:
    """`postgresql://…` → the psycopg 3 driver; `sqlite:///path`; anything else is refused."""
    try:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError
    except ImportError:
        raise StoreError("the history store needs SQLAlchemy: pip install 'slime-ci[history]'") from None
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError):
        raise UsageError(f"history URL {_redact(raw)!r} is malformed; use "
                         "postgresql://user@host:5432/db or sqlite:///path/history.sqlite") from None
    backend = url.get_backend_name()
    if backend in ("postgresql", "postgres"):
        if url.drivername in ("postgresql", "postgres", "postgresql+psycopg"):
            url = url.set(drivername="postgresql+psycopg")
        else:
            raise UsageError(f"history URL driver {url.drivername!r}: use postgresql:// (psycopg 3)")
        if not url.database:
            raise UsageError(f"history URL {_redact(raw)!r} names no database")
    elif backend == "sqlite":
        if not url.database or url.database == ":memory:":
            raise UsageError("a sqlite history URL needs a file: sqlite:///path/history.sqlite")
    else:
        raise UsageError(f"history URL {_redact(raw)!r}: only postgresql:// and sqlite:/// stores exist")
    return url.render_as_string(hide_password=False)


# A query parameter that carries a secret (libpq takes `password` and `sslpassword` there).
_SECRET_PARAM = re.compile(r"(?i)(pass|secret|token|key)")


def _redact(raw: str) -> str:
    # Never print a password from a URL in a log: neither user:password@ nor ?password=.
    head, sep, tail = raw.rpartition("@")
    if sep and "://" in head:
        scheme, _, cred = head.partition("://")
        if ":" in cred:
            raw = f"{scheme}://{cred.split(':', 1)[0]}:***@{tail}"
    return re.sub(r"([?&;][^=&;#]*=)([^&;#]*)",
                  lambda m: m.group(1) + ("***" if _SECRET_PARAM.search(m.group(1)) else m.group(2)), raw)


def describe(url: str) -> str:
    """The URL for a log line, passwords hidden (in the user part and in the query string)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    hidden = {k: "***" for k in parsed.query if _SECRET_PARAM.search(k)}
    shown = parsed.update_query_dict(hidden).render_as_string(hide_password=True)
    return shown.replace("=%2A%2A%2A", "=***")


class RecordRefused(StoreError):
    """The store works, but this record can never be written (a value no column holds).

    Spooling it would only fail again on every later run: it is reported and dropped.
    """


@dataclass(frozen=True, kw_only=True)
class AttemptRow:
    """An attempt as read back, with the run it belongs to."""

    run_uid: str
    suite: str
    commit: str
    branch: str
    event: str
    hardware: str
    started_at: float
    entry_id: str
    path: str
    attempt: int
    final: bool
    outcome: str
    seconds: float
    reason: str
    num_gpus: int
    trusted: bool = True
    pr: int | None = None
    exit_code: int | None = None  # the attempt's own exit status (schema 3); None: not recorded
    node: str = ""
    backend: str = ""  # where its run ran (`runs.backend`: "docker IMAGE", "local", ...)
    fail_path: str = ""  # where its failure's assertion is (schema 6); "" when unknown
    fail_line: int | None = None
    gh_run_id: str = ""  # the Actions run, attempt and job of its run (schema 6); "": not known
    gh_run_attempt: int | None = None
    gh_job: str = ""


@dataclass(frozen=True, kw_only=True)
class ExecutedRow:
    """The newest record of what an entry executed, and the run that made it."""

    entry_id: str
    commit: str
    started_at: float
    run_uid: str
    files: Mapping[str, tuple[str, ...]]
    lines: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # file -> (blob, spans)


@dataclass(frozen=True, kw_only=True)
class MetricRow:
    run_uid: str
    started_at: float
    step: int
    name: str
    value: float


class HistoryStore:
    """An open, migrated store."""

    def __init__(self, url: str, *, connect_timeout: float = 5.0, create: bool = True) -> None:
        from sqlalchemy import create_engine, event

        self.url = url
        self.dialect = "postgresql" if url.startswith("postgresql") else "sqlite"
        if self.dialect == "sqlite":
            path = Path(url.split(":///", 1)[1])
            if not create and not path.is_file():
                # A command that only reads never leaves a new, empty store behind.
                raise StoreError(f"no history store at {path}: nothing was recorded there yet; "
                                 "run a suite first, or pass --history URL")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"history store {path}: cannot create its directory ({exc})") from None
            self.engine = create_engine(url, connect_args={"timeout": _SQLITE_WAIT_S})

            # Several runs may write one file at once: take the write lock when a
            # transaction begins (BEGIN IMMEDIATE), and wait for it, instead of
            # failing later on a lock upgrade.
            @event.listens_for(self.engine, "connect")
            def _connect(dbapi_conn: Any, _record: Any) -> None:
                dbapi_conn.isolation_level = None
                dbapi_conn.execute("PRAGMA foreign_keys=ON")

            @event.listens_for(self.engine, "begin")
            def _begin(conn: Any) -> None:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            self.engine = create_engine(url, pool_pre_ping=True,
                                        connect_args={"connect_timeout": int(max(1, connect_timeout))})
        try:
            self._migrate()
        except StoreError:
            self.engine.dispose()  # no connection left open behind a store we refuse
            raise

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _fail(self, exc: Exception, doing: str) -> StoreError:
        text = str(getattr(exc, "orig", exc) or exc).strip().splitlines()
        first = text[0] if text else type(exc).__name__
        where = describe(self.url)
        if self.dialect == "sqlite" and "not a database" in first:
            return StoreError(f"history store {where} is not a SQLite database (corrupt?): move it "
                              "aside and rerun; a new one is made, the old file is left as it is")
        return StoreError(f"history store {where}: cannot {doing}: {first}")

    def _migrate(self) -> None:
        from sqlalchemy import select, text
        from sqlalchemy.exc import SQLAlchemyError

        from ci.history import schema

        try:
            with self.engine.begin() as conn:
                if self.dialect == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
                schema.meta.create(conn, checkfirst=True)
                raw = conn.execute(select(schema.meta.c.value)
                                   .where(schema.meta.c.key == "schema_version")).scalar()
                version = int(raw) if raw is not None else 0
                if version > schema.LATEST:
                    raise StoreError(
                        f"history store {describe(self.url)} has schema version {version}, newer than "
                        f"this slime-ci knows ({schema.LATEST}): upgrade slime-ci, or use another store")
                for number, _what, step in schema.MIGRATIONS:
                    if number > version:
                        step(conn)
                if version < schema.LATEST:
                    if raw is None:
                        conn.execute(schema.meta.insert().values(key="schema_version",
                                                                 value=str(schema.LATEST)))
                    else:
                        conn.execute(schema.meta.update().where(schema.meta.c.key == "schema_version")
                                     .values(value=str(schema.LATEST)))
                self.version = schema.LATEST
        except SQLAlchemyError as exc:
            raise self._fail(exc, "open it") from None

    def record(self, run: RunRecord) -> bool:
        """Write one run with its attempts and metrics; False when it was already there.

        A record no column can hold (a NaN, a step past the integer column, a string too
        long) is RecordRefused before anything is written.
        """
        return self.record_all((run,)) == 1

    def record_all(self, runs: Sequence[RunRecord]) -> int:
        """Write the runs in one transaction, all or none; how many were new (the others were
        there already). Every record is checked before the transaction begins."""
        from sqlalchemy.exc import IntegrityError, SQLAlchemyError

        for run in runs:
            check_record(run)
        for tries_left in (1, 0):
            try:
                with self.engine.begin() as conn:
                    return sum(self._insert(conn, run) for run in runs)
            except IntegrityError as exc:
                # Only a uid that is there now means "another writer recorded this very run a
                # moment ago": then the batch is tried again, and skips it. Any other
                # constraint is a record's fault.
                if tries_left and any(self._has(run.uid) for run in runs):
                    continue
                uid = next((r.uid for r in runs if not self._has(r.uid)), runs[0].uid if runs else "")
                raise RecordRefused(f"run {uid[:8]} cannot be recorded: "
                                    f"{self._fail(exc, 'record the run')}") from None
            except SQLAlchemyError as exc:
                raise self._fail(exc, "record the run") from None
        return 0  # not reached: the second try returns or raises

    @staticmethod
    def _insert(conn: Any, run: RunRecord) -> bool:
        from sqlalchemy import select

        from ci.history import schema

        if conn.execute(select(schema.runs.c.id).where(schema.runs.c.uid == run.uid)).first():
            return False
        row = {k: getattr(run, k) for k in _RUN_FIELDS}
        pk = conn.execute(schema.runs.insert().values(**row)).inserted_primary_key
        run_id = pk[0] if pk is not None else None
        if run.attempts:
            conn.execute(schema.attempts.insert(), [
                {"run_id": run_id, **{k: getattr(a, k) for k in _ATTEMPT_FIELDS}} for a in run.attempts])
        if run.metrics:
            conn.execute(schema.metrics.insert(), [
                {"run_id": run_id, "entry_id": m.entry_id, "step": m.step, "name": m.name,
                 "value": m.value} for m in run.metrics])
        if run.executed:
            conn.execute(schema.executed.insert(), [
                {"run_id": run_id, "entry_id": x.entry_id, "files": _files_json(x.files),
                 "lines": lines_json(x.lines)}
                for x in run.executed])
        return True

    def _has(self, uid: str) -> bool:
        from sqlalchemy import select
        from sqlalchemy.exc import SQLAlchemyError

        from ci.history import schema

        try:
            with self.engine.connect() as conn:
                return conn.execute(select(schema.runs.c.id).where(schema.runs.c.uid == uid)).first() \
                    is not None
        except SQLAlchemyError as exc:
            raise self._fail(exc, "read it") from None

    def attempts(self, *, suite: str | None = None, hardware: str | None = None,
                 branch: str | None = None, entries: Iterable[str] | None = None,
                 last_runs: int = 500, trusted_only: bool = False, pr: int | None = None,
                 run_uid: str | None = None) -> list[AttemptRow]:
        """Attempts of the newest `last_runs` matching runs, oldest first; `trusted_only` leaves
        out runs of pull requests' code (never a baseline); `pr` keeps one pull request's runs,
        `run_uid` one run (a unique prefix of its uid)."""
        from sqlalchemy import select
        from sqlalchemy.exc import SQLAlchemyError

        from ci.history import schema

        r, a = schema.runs, schema.attempts
        newest = select(r.c.id).order_by(r.c.started_at.desc(), r.c.id.desc()).limit(last_runs)
        if suite is not None:
            newest = newest.where(r.c.suite == suite)
        if hardware is not None:
            newest = newest.where(r.c.hardware == hardware)
        if branch is not None:
            newest = newest.where(r.c.branch == branch)
        if trusted_only:
            newest = newest.where(r.c.trusted.is_(True))
        if pr is not None:
            newest = newest.where(r.c.pr == pr)
        if run_uid is not None:
            newest = newest.where(r.c.uid.startswith(run_uid, autoescape=True))
        query = (select(r.c.uid, r.c.suite, r.c.commit, r.c.branch, r.c.event, r.c.hardware,
                        r.c.started_at, r.c.trusted, r.c.pr, a.c.entry_id, a.c.path, a.c.attempt,
                        a.c.final, a.c.outcome,
                        a.c.seconds, a.c.reason, a.c.num_gpus, a.c.exit_code, a.c.node, r.c.backend,
                        a.c.fail_path, a.c.fail_line, r.c.gh_run_id, r.c.gh_run_attempt, r.c.gh_job)
                 .join(a, a.c.run_id == r.c.id)
                 .where(r.c.id.in_(newest.scalar_subquery()))
                 .order_by(r.c.started_at, r.c.id, a.c.entry_id, a.c.attempt))
        if entries is not None:
            query = query.where(a.c.entry_id.in_(list(entries)))
        try:
            with self.engine.connect() as conn:
                # Rows unpacked by position: a long history is 100,000 rows and more, and a
                # Row's attributes by name cost several times more than the query itself.
                return [AttemptRow(run_uid=uid, suite=suite, commit=commit, branch=branch, event=event,
                                   hardware=hardware, started_at=started_at, entry_id=entry_id, path=path,
                                   attempt=attempt, final=bool(final), outcome=outcome, seconds=seconds,
                                   reason=reason, num_gpus=num_gpus, trusted=bool(trusted), pr=pr,
                                   exit_code=exit_code, node=node, backend=backend, fail_path=fail_path,
                                   fail_line=fail_line, gh_run_id=gh_run_id, gh_run_attempt=gh_run_attempt,
                                   gh_job=gh_job)
                        for (uid, suite, commit, branch, event, hardware, started_at, trusted, pr, entry_id,
                             path, attempt, final, outcome, seconds, reason, num_gpus, exit_code, node,
                             backend, fail_path, fail_line, gh_run_id, gh_run_attempt, gh_job)
                        in conn.execute(query).tuples().all()]
        except SQLAlchemyError as exc:
            raise self._fail(exc, "read it") from None

    def metric_series(self, entry_id: str, *, hardware: str, names: Sequence[str],
                      last_runs: int = 15, exclude_uid: str = "") -> list[MetricRow]:
        """Metric points of the entry's last trusted runs (its final attempt passed) on this hardware."""
        from sqlalchemy import select
        from sqlalchemy.exc import SQLAlchemyError

        from ci.history import schema

        r, a, m = schema.runs, schema.attempts, schema.metrics
        baseline = (select(r.c.id).join(a, a.c.run_id == r.c.id)
                    .where(a.c.entry_id == entry_id, a.c.final.is_(True), a.c.outcome == "passed",
                           r.c.hardware == hardware, r.c.uid != exclude_uid, r.c.trusted.is_(True))
                    .order_by(r.c.started_at.desc(), r.c.id.desc()).limit(last_runs))
        query = (select(r.c.uid, r.c.started_at, m.c.step, m.c.name, m.c.value)
                 .join(m, m.c.run_id == r.c.id)
                 .where(m.c.entry_id == entry_id, m.c.name.in_(list(names)),
                        r.c.id.in_(baseline.scalar_subquery()))
                 .order_by(r.c.started_at, m.c.step))
        try:
            with self.engine.connect() as conn:
                return [MetricRow(run_uid=x.uid, started_at=x.started_at, step=x.step, name=x.name,
                                  value=x.value) for x in conn.execute(query)]
        except SQLAlchemyError as exc:
            raise self._fail(exc, "read it") from None

    def runs(self, *, trusted_only: bool = False, newest: int | None = None) -> list[RunRecord]:
        """Every run with its attempts and metric points, oldest first (to merge stores).

        `trusted_only`: runs of reviewed code only; `newest`: the newest N of each suite and
        hardware only. Both are chosen in SQL, so that the rows of the runs left out (a
        pull request's metric points, the old runs) are never read.
        """
        from sqlalchemy import func, select
        from sqlalchemy.exc import SQLAlchemyError

        from ci.history import schema
        from ci.history.rows import AttemptRecord, ExecutedRecord
        from ci.results import MetricPoint

        r, a, m, e = schema.runs, schema.attempts, schema.metrics, schema.executed
        fields = [c.name for c in a.columns if c.name not in ("id", "run_id")]
        chosen = select(r.c.id)
        if trusted_only:
            chosen = chosen.where(r.c.trusted.is_(True))
        if newest is not None:
            place = (func.row_number().over(partition_by=(r.c.suite, r.c.hardware),
                                            order_by=(r.c.started_at.desc(), r.c.id.desc()))
                     .label("place"))
            ranked = chosen.add_columns(place).subquery()
            chosen = select(ranked.c.id).where(ranked.c.place <= newest)
        wanted = chosen.scalar_subquery()
        try:
            with self.engine.connect() as conn:
                tries: dict[int, list[AttemptRecord]] = {}
                for x in conn.execute(select(a).where(a.c.run_id.in_(wanted))
                                      .order_by(a.c.run_id, a.c.entry_id, a.c.attempt)):
                    tries.setdefault(x.run_id, []).append(
                        AttemptRecord(**{k: getattr(x, k) for k in fields}))
                points: dict[int, list[MetricPoint]] = {}
                for x in conn.execute(select(m).where(m.c.run_id.in_(wanted))
                                      .order_by(m.c.run_id, m.c.entry_id, m.c.step, m.c.name)):
                    points.setdefault(x.run_id, []).append(
                        MetricPoint(entry_id=x.entry_id, step=x.step, name=x.name, value=x.value))
                ran: dict[int, list[ExecutedRecord]] = {}
                for x in conn.execute(select(e).where(e.c.run_id.in_(wanted))
                                      .order_by(e.c.run_id, e.c.entry_id)):
                    ran.setdefault(x.run_id, []).append(
                        ExecutedRecord(entry_id=x.entry_id, files=_files_of(x.files),
                                       lines=lines_of(x.lines)))
                return [RunRecord(**{k: getattr(x, k) for k in _RUN_FIELDS},
                                  attempts=tuple(tries.get(x.id, ())), metrics=tuple(points.get(x.id, ())),
                                  executed=tuple(ran.get(x.id, ())))
                        for x in conn.execute(select(r).where(r.c.id.in_(wanted))
                                              .order_by(r.c.started_at, r.c.id))]
        except SQLAlchemyError as exc:
            raise self._fail(exc, "read it") from None

    def executed(self, *, trusted_only: bool = True) -> dict[str, ExecutedRow]:
        """The newest record per entry of what it executed (`run --record-executed`), from
        trusted runs only unless told otherwise: a pull request's code never decides what
        another pull request runs."""
        from sqlalchemy import func, select
        from sqlalchemy.exc import SQLAlchemyError

        from ci.history import schema

        r, e = schema.runs, schema.executed
        place = (func.row_number().over(partition_by=e.c.entry_id,
                                        order_by=(r.c.started_at.desc(), r.c.id.desc())).label("place"))
        ranked = (select(e.c.entry_id, e.c.files, e.c.lines, r.c.commit, r.c.started_at, r.c.uid, place)
                  .join(r, r.c.id == e.c.run_id))
        if trusted_only:
            ranked = ranked.where(r.c.trusted.is_(True))
        sub = ranked.subquery()
        try:
            with self.engine.connect() as conn:
                return {x.entry_id: ExecutedRow(entry_id=x.entry_id, commit=x.commit,
                                                started_at=float(x.started_at), run_uid=x.uid,
                                                files=_files_of(x.files), lines=lines_of(x.lines))
                        for x in conn.execute(select(sub).where(sub.c.place == 1))}
        except SQLAlchemyError as exc:
            raise self._fail(exc, "read it") from None

    def lift(self, *, suite: str, entry_id: str, at: float, why: str) -> bool:
        """Record that an entry's quarantine was lifted at `at`; False when it already was."""
        from sqlalchemy import select
        from sqlalchemy.exc import IntegrityError, SQLAlchemyError

        from ci.history import schema

        t = schema.lifts
        try:
            with self.engine.begin() as conn:
                if conn.execute(select(t.c.id).where(t.c.suite == suite, t.c.entry_id == entry_id,
                                                     t.c.at == at)).first():
                    return False
                conn.execute(t.insert().values(suite=suite, entry_id=entry_id, at=at, why=why[:500]))
        except IntegrityError:
            return False
        except SQLAlchemyError as exc:
            raise self._fail(exc, "record the lift") from None
        return True

    def lifts(self, suite: str | None = None) -> dict[tuple[str, str], float]:
        """(suite, entry) -> when its quarantine was last lifted by hand."""
        from sqlalchemy import func, select
        from sqlalchemy.exc import SQLAlchemyError

        from ci.history import schema

        t = schema.lifts
        query = select(t.c.suite, t.c.entry_id, func.max(t.c.at)).group_by(t.c.suite, t.c.entry_id)
        if suite is not None:
            query = query.where(t.c.suite == suite)
        try:
            with self.engine.connect() as conn:
                return {(s, e): float(at) for s, e, at in conn.execute(query).tuples()}
        except SQLAlchemyError as exc:
            raise self._fail(exc, "read it") from None

    def counts(self) -> dict[str, int]:
        """Rows per table (for `history show` and the tests)."""
        from sqlalchemy import func, select
        from sqlalchemy.exc import SQLAlchemyError

        from ci.history import schema

        try:
            with self.engine.connect() as conn:
                return {t.name: int(conn.execute(select(func.count()).select_from(t)).scalar() or 0)
                        for t in (schema.runs, schema.attempts, schema.metrics)}
        except SQLAlchemyError as exc:
            raise self._fail(exc, "read it") from None


_ATTEMPT_FIELDS = ("entry_id", "path", "attempt", "final", "outcome", "passed", "failed", "skipped",
                   "num_gpus", "devices", "node", "seconds", "reason", "exit_code", "fail_path", "fail_line")
# PostgreSQL's INTEGER is 32-bit; SQLite's would take more, but a store may move.
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1


def _bad_value(value: object, column: Any) -> str | None:
    """Why `column` cannot hold `value` on every dialect; None when it can."""
    from sqlalchemy import Boolean, Float, Integer, String

    kind = column.type
    if value is None:
        return None if column.nullable else "is empty"
    if isinstance(kind, Boolean):
        return None if isinstance(value, bool) else f"is {type(value).__name__}, not a boolean"
    if isinstance(kind, Integer):
        if not isinstance(value, int) or isinstance(value, bool):
            return f"is {type(value).__name__}, not an integer"
        return None if _INT_MIN <= value <= _INT_MAX else "is past the 32-bit integer column"
    if isinstance(kind, Float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"is {type(value).__name__}, not a number"
        try:
            return None if math.isfinite(float(value)) else f"{value} is not a finite number"
        except OverflowError:
            return "is past any float"
    if isinstance(kind, String):  # Text is a String without a length
        if not isinstance(value, str):
            return f"is {type(value).__name__}, not text"
        if "\x00" in value:
            return "holds a NUL character"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid Unicode (a lone surrogate)"
        if kind.length is not None and len(value) > kind.length:
            return f"is {len(value)} characters, more than its {kind.length}"
    return None


def _files_json(files: Mapping[str, Sequence[str]]) -> str:
    return json.dumps({f: list(fns) for f, fns in sorted(files.items())}, sort_keys=True)


def _files_of(text: str) -> dict[str, tuple[str, ...]]:
    """A row's files as written by `_files_json`; {} for a row no writer of ours made."""
    try:
        raw = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(raw, dict):
        return {}
    return {str(f): tuple(str(n) for n in fns) for f, fns in raw.items() if isinstance(fns, list)}


def _check_executed(run: RunRecord) -> None:
    """RecordRefused when a record of executed code is past the bounds of `ci.history.rows`."""
    from ci.history import schema
    from ci.history.rows import MAX_EXECUTED_FILES, MAX_EXECUTED_FUNCTIONS, MAX_FUNCTION_CHARS

    def refuse(why: str) -> None:
        raise RecordRefused(f"run {str(run.uid)[:8]} cannot be recorded: {why}")

    seen = set()
    for x in run.executed:
        where = f"executed {str(x.entry_id)[:80]}"
        if _bad_value(x.entry_id, schema.executed.c.entry_id) is not None or x.entry_id in seen:
            refuse(f"{where}: its entry id is not text, or is listed twice")
        seen.add(x.entry_id)
        if not isinstance(x.files, Mapping) or len(x.files) > MAX_EXECUTED_FILES:
            refuse(f"{where}: more than {MAX_EXECUTED_FILES} files")
        count = 0
        for path, fns in x.files.items():
            names = [path, *fns] if isinstance(fns, (tuple, list)) else None
            if names is None or any(not isinstance(n, str) or len(n) > MAX_FUNCTION_CHARS or "\x00" in n
                                    for n in names):
                refuse(f"{where}: a file or function name is not text of at most "
                       f"{MAX_FUNCTION_CHARS} characters")
            count += len(fns)
        if count > MAX_EXECUTED_FUNCTIONS:
            refuse(f"{where}: more than {MAX_EXECUTED_FUNCTIONS} functions")
        if (why := lines_problem(x.lines)) is not None:
            refuse(f"{where}: {why}")


def check_record(run: RunRecord) -> None:
    """RecordRefused, naming the first field no column of the schema can hold; else nothing."""
    from ci.history import schema

    def check(table: Any, values: Mapping[str, object], where: str) -> None:
        for name, value in values.items():
            why = _bad_value(value, table.c[name])
            if why is not None:
                shown = f"{where}.{name}" if where else name
                raise RecordRefused(f"run {str(run.uid)[:8]} cannot be recorded: {shown} {why}")

    check(schema.runs, {k: getattr(run, k) for k in _RUN_FIELDS}, "")
    tries = set()
    for a in run.attempts:
        check(schema.attempts, {k: getattr(a, k) for k in _ATTEMPT_FIELDS}, f"attempt {str(a.entry_id)[:80]}")
        tries.add((a.entry_id, a.attempt))
    if len(tries) != len(run.attempts):
        raise RecordRefused(f"run {str(run.uid)[:8]} cannot be recorded: an attempt is listed twice")
    points = set()
    for m in run.metrics:
        check(schema.metrics, {"entry_id": m.entry_id, "step": m.step, "name": m.name, "value": m.value},
              f"metric {str(m.name)[:80]}")
        points.add((m.entry_id, m.step, m.name))
    if len(points) != len(run.metrics):
        raise RecordRefused(f"run {str(run.uid)[:8]} cannot be recorded: a metric point is listed twice")
    _check_executed(run)


def open_store(url: str, *, create: bool = True) -> HistoryStore:
    """Open (and migrate) a store; every failure is one StoreError line. `create=False`
    (commands that only read): a SQLite file that does not exist is a StoreError, not made."""
    try:
        import sqlalchemy  # noqa: F401
    except ImportError:
        raise StoreError("the history store needs SQLAlchemy: pip install 'slime-ci[history]'") from None
    if url.startswith("postgresql"):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise StoreError("a PostgreSQL history store needs psycopg 3: "
                             "pip install 'slime-ci[history]'") from None
    return HistoryStore(url, create=create)
