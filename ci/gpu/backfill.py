"""The EASY backfilling decision: who in the queue may start now, on which GPUs.

Pure: it reads tickets, free GPUs and holders' expected ends, and returns a `Schedule`;
the acquire loop (`ci/gpu/allocator.py`) probes the lock files and acts on it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ci.gpu.tickets import _Ticket

# How often a waiter may be passed by backfilling before nobody may pass it any more: a
# bound on what wrong expectations can cost it (honest ones cost the head nothing).
MAX_PASSES = 16
# A backfiller may be expected to end this long after the head's reservation: waiters woken
# by one release decide one after another, milliseconds to a few hundred apart on a busy
# host, and without it one deciding just after another started would lose every tie. It
# is the most the head can start later than under strict FIFO (with honest expectations).
BACKFILL_SLACK = 0.5


def claim(count: int | None, devices: tuple[int, ...] | None,
          avail: list[int]) -> tuple[list[int], list[int]]:
    """(GPUs a request takes or reserves from `avail`, GPUs left for later requests)."""
    if devices is not None:
        wanted = set(devices)
        return [g for g in avail if g in wanted], [g for g in avail if g not in wanted]
    n = count or 0
    return avail[:n], avail[n:]


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """What the queue decides at one moment: who may start now on which GPUs.

    `starts` maps a ticket to the GPUs it may take now; `passed` a backfilling ticket to the
    earlier waiters it starts ahead of; `head` is the first waiter that must wait and
    `reservation` when its GPUs are expected free.
    """

    starts: dict[int, tuple[int, ...]]
    passed: dict[int, tuple[int, ...]]
    head: int | None
    reservation: float | None


def _reservation(ticket: _Ticket, ends: dict[int, float]) -> float:
    """When `ticket` could start if nobody else took a GPU: from each GPU's expected end."""
    never = float("inf")  # a GPU this machine lacks: a request that can never start
    if ticket.devices is not None:
        return max(ends.get(g, never) for g in ticket.devices)
    ordered = sorted(ends.values())
    return ordered[ticket.size - 1] if ticket.size <= len(ordered) else never


def schedule(tickets: Sequence[_Ticket], free: Sequence[int], ends: dict[int, float],
             now: float, passes: dict[int, int] | None = None, *,
             lent: dict[int, tuple[int, ...]] | None = None, slack: float | None = None,
             max_passes: int = MAX_PASSES, distrusted: Collection[int] = ()) -> Schedule:
    """Walk the queue in ticket order (EASY backfilling).

    `free`: GPUs nobody holds; `ends`: each held GPU's expected end (see `expected_end`).
    A waiter that fits in what earlier waiters left starts. The first that does not is the
    head: it claims the free GPUs it can use and gets a reservation. A later waiter with an
    expectation that ends by the reservation (give or take `slack`, default BACKFILL_SLACK),
    and that passes nobody passed `max_passes` times already, may start on the head's
    claimed GPUs too; any other waits and claims. A reservation of now lends nothing, and
    the tickets in `distrusted` (commands that overran their expectations,
    `ci/gpu/overruns.py`) never backfill and, starting now, count as ending any moment.

    `lent`: per held GPU, the tickets its holder backfilled past. GPUs lent by the head count
    as ending now in its reservation: a backfiller expected to end `slack` after it never
    moves it, so `slack` is all the head can lose, however many backfill one after another.
    """
    passes = passes or {}
    lent = lent or {}
    slack = BACKFILL_SLACK if slack is None else slack
    est = dict(ends)
    est.update((g, now) for g in free)
    avail = sorted(free)
    lend: list[int] = []
    head: _Ticket | None = None
    reservation: float | None = None
    waiting: list[int] = []
    starts: dict[int, tuple[int, ...]] = {}
    passed: dict[int, tuple[int, ...]] = {}
    for t in tickets:
        mine, rest = claim(t.count, t.devices, avail)
        if len(mine) == t.size:
            starts[t.number] = tuple(mine)
            avail = rest
            if head is None:  # starts now, expected to end after its expectation
                trusted = t.number not in distrusted
                est.update((g, now + (t.expect if trusted and t.expect else 0.0)) for g in mine)
            continue
        if head is None:
            number = t.number
            head = t
            reservation = _reservation(t, {g: now if number in lent.get(g, ()) else end
                                           for g, end in est.items()})
            lend, avail = mine, rest
            waiting.append(t.number)
            continue
        assert reservation is not None
        # A reservation of now (a holder without an expectation, or past it) lends nothing:
        # the head may start any moment, and the slack, meant for ties between waiters woken
        # by one release, would let any `--expect 0.5` in ahead of it, again and again.
        if (t.backfill and t.expect is not None and t.number not in distrusted
                and reservation > now and now + t.expect <= reservation + slack
                and all(passes.get(w, 0) < max_passes for w in waiting)):
            borrowed, _ = claim(t.count, t.devices, avail + lend)
            if len(borrowed) == t.size:
                starts[t.number] = tuple(sorted(borrowed))
                passed[t.number] = tuple(waiting)
                avail = [g for g in avail if g not in borrowed]
                lend = [g for g in lend if g not in borrowed]
                continue
        _, avail = claim(t.count, t.devices, avail)
        waiting.append(t.number)
    return Schedule(starts=starts, passed=passed, head=head.number if head else None,
                    reservation=reservation)

