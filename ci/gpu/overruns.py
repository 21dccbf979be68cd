"""Whose expectations backfilling still trusts: a command that overran its last ones does not.

A backfiller is let in on the head's GPUs because it says it will be done by the head's
reservation. One that says so and then runs long delays the head, and `MAX_PASSES` only
bounds how often that can happen to one waiter. So the queue remembers, per command (the
text a holder runs: an entry's argv is the same from run to run), the holdings that ran past
their expectation in a row. After `OVERRUN_LIMIT` of them the command's claims are not
trusted: it does not backfill, and while it holds GPUs they count as freeing up any moment,
as a holder without an expectation does. One holding that ends within its expectation
forgives it.

Pure functions over the book kept in the queue file (`ci/gpu/tickets.py`); a command is
known by its text alone, so a forged holder record can take backfilling away from a command
(it then waits its turn), never give anyone GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping

# "Repeatedly": one overrun is an estimate that was off once (a slow disk, a cold cache).
OVERRUN_LIMIT = 2
# Commands remembered: more than the entries one host runs at once; the oldest go first.
TRACKED = 64
# A command is remembered by its first characters: enough to tell entries apart.
KEY_LIMIT = 512

Book = Mapping[str, tuple[int, ...]]


def key(command: str) -> str:
    """What a command is remembered by."""
    return command[:KEY_LIMIT]


def noted(book: Book, command: str, ticket: int) -> dict[str, tuple[int, ...]]:
    """The book with holding `ticket` of `command` counted as an overrun (once per holding)."""
    name = key(command)
    out = dict(book)
    if not name:
        return out  # no command, no identity to hold it against
    late = out.get(name, ())
    if ticket not in late:
        out[name] = (*late, ticket)[-OVERRUN_LIMIT:]
    if len(out) > TRACKED:
        # Forget the commands whose last overrun is oldest (tickets only grow).
        for old in sorted(out, key=lambda k: max(out[k], default=0))[: len(out) - TRACKED]:
            del out[old]
    return out


def forgiven(book: Book, command: str) -> dict[str, tuple[int, ...]]:
    """The book once a holding of `command` ended within its expectation."""
    return {k: v for k, v in book.items() if k != key(command)}


def distrusted(book: Book) -> frozenset[str]:
    """Commands whose expectations backfilling no longer trusts."""
    return frozenset(k for k, v in book.items() if len(v) >= OVERRUN_LIMIT)


def trusted(book: Book, command: str) -> bool:
    """Whether `command`'s expectation may let it backfill (and plan around it as a holder)."""
    return key(command) not in distrusted(book)
