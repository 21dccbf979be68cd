"""The bisect answers of the history (table `bisects`, schema 3): what `python -m ci bisect`
found for an entry's failure streak, written by the bisect or by the ingest job
(ci/history/ingest.py), and read by the monitor, the issues, the HUD and select-audit.

The table's three queries take an open store, as ci/hud/read.py's do, so the store
itself stays under the project's module length.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ci.errors import StoreError

if TYPE_CHECKING:  # store.py imports nothing of this module: no circle
    from ci.history.store import HistoryStore


@dataclass(frozen=True, kw_only=True)
class BisectRow:
    """One finished bisect: the entry, the range it searched, and its one-line answer."""

    suite: str
    entry_id: str
    good: str
    bad: str
    kind: str  # first-bad, rate-rose, undetermined, refused
    commit: str  # the answer; "" when there is none
    summary: str
    started_at: float


def bisected(store: HistoryStore, entry_id: str, *, bad: str) -> bool:
    """Whether a bisect answer (table `bisects`) exists for the entry with this bad end."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from ci.history import schema

    b = schema.bisects
    try:
        with store.engine.connect() as conn:
            return conn.execute(select(b.c.id).where(b.c.entry_id == entry_id, b.c.bad == bad)
                                .limit(1)).first() is not None
    except SQLAlchemyError as exc:
        raise store._fail(exc, "read it") from None  # the store's own wording


def record_bisects(store: HistoryStore, rows: Sequence[Mapping[str, Any]]) -> int:
    """Write bisect answers (rows of table `bisects`, keyed by `uid`) in one transaction;
    how many were new: an answer ingested twice (a rerun ingest job) is kept once."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from ci.history import schema

    b = schema.bisects
    try:
        with store.engine.begin() as conn:
            added = 0
            for row in rows:
                if conn.execute(select(b.c.id).where(b.c.uid == row["uid"])).first() is None:
                    conn.execute(b.insert().values(**row))
                    added += 1
            return added
    except SQLAlchemyError as exc:
        raise store._fail(exc, "record the bisect answer") from None  # the store's own wording


def bisects(store: HistoryStore) -> list[BisectRow]:
    """Every bisect answer (table `bisects`), oldest first."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from ci.history import schema

    b = schema.bisects
    query = (select(b.c.suite, b.c.entry_id, b.c.good, b.c.bad, b.c.kind, b.c.commit, b.c.summary,
                    b.c.started_at).order_by(b.c.started_at, b.c.id))
    try:
        with store.engine.connect() as conn:
            return [BisectRow(suite=s, entry_id=e, good=g, bad=bad, kind=k, commit=c, summary=text,
                              started_at=at)
                    for s, e, g, bad, k, c, text, at in conn.execute(query).tuples()]
    except SQLAlchemyError as exc:
        raise StoreError(f"history store: cannot read its bisects: {str(exc).splitlines()[0]}") from None
