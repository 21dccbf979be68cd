"""The bisect's search, as pure logic: which commits to test next, how often, and the verdict.

Commits are indices into the range: 0 is the good end, n the bad end, 1..n-1 the commits in
between, oldest first. Each round tests up to `width` commits at once (one per free GPU set)
at the points that cut the unknown stretch into `width + 1` equal parts: a (g+1)-ary search,
log_{g+1} n rounds where binary search takes log2 n.

An entry with a flake history is run `k` times per commit, `k` from its rate (`attempts_for`),
and a commit stops early once its verdict is settled. Two kinds of answer:

- break: the bad end fails every attempt. A commit is bad when every attempt failed; a flaky
  commit that passed once is not the culprit. `k` makes `rate ** k` (a sound commit failing
  `k` times by chance) at most 1 - confidence.
- rate: the bad end fails only sometimes and the good end never did. A commit is bad when any
  attempt failed: the answer is "the flake rate rose at commit X", never a culprit for a break.
  `k` makes `(1 - rate) ** k` (a commit at the new rate passing `k` times) at most 1 - confidence.

A commit that cannot be tested (it does not install, its entry does not exist) is skipped, as
`git bisect skip` does; when skipped commits sit next to the answer, the answer names them all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ci.errors import UsageError

Mode = Literal["break", "rate"]
Kind = Literal["first-bad", "rate-rose", "undetermined"]
DEFAULT_CONFIDENCE = 0.99
# Past this many attempts per commit a bisect is no answer at all (a rate of 1e-6 needs 4.6
# million): such a rate is refused, not bisected.
MOST_ATTEMPTS_NEEDED = 1_000_000
MAX_ATTEMPTS = 30  # the default budget of attempts on one commit


def attempts_for(rate: float, confidence: float = DEFAULT_CONFIDENCE) -> int:
    """Attempts per commit for an entry with this flake rate, so that one commit's verdict
    holds with `confidence` whether the range holds a break or a rise of the rate to `rate`.

    A rate of 0 (no flake history): one attempt. A rate of 1 tells nothing: refused.
    """
    if not 0 < confidence < 1:
        raise UsageError(f"--confidence {confidence:g}: must be between 0 and 1 (exclusive), e.g. 0.99")
    if not 0 <= rate < 1:
        raise UsageError(f"flake rate {rate:g}: must be at least 0 and below 1")
    if rate == 0:
        return 1
    miss = math.log1p(-confidence)
    # A sound commit failing every attempt by chance; a commit at the new rate never failing.
    # log1p: for a rate of 1e-300, log(1 - rate) is 0.0 and the division fails.
    needed = max(miss / math.log(rate), miss / math.log1p(-rate))
    if needed > MOST_ATTEMPTS_NEEDED:
        raise UsageError(f"flake rate {rate:g} at confidence {confidence:g}: one commit's verdict "
                         f"takes more than {MOST_ATTEMPTS_NEEDED:,} attempts; pass a rate of 0 (no "
                         "flake history) or of at least 1e-05, or a lower --confidence")
    return max(1, math.ceil(miss / math.log(rate) - 1e-9), math.ceil(miss / math.log1p(-rate) - 1e-9))


def confidence_of(rate: float, k: int) -> float:
    """The confidence one commit's verdict holds with after `k` attempts at flake rate `rate`."""
    if rate == 0:
        return 1.0
    return 1 - max(rate ** k, (1 - rate) ** k)


def rounds_bound(n: int, width: int, *, flaky: bool) -> int:
    """Rounds the search takes at most without skipped commits: the good end (with the bad end
    beside it when the entry is flaky and `width` allows), ⌈log_{width+1} n⌉ rounds of
    probes, and one more to confirm the bad end when it was assumed and is the answer."""
    probes = math.ceil(math.log(n) / math.log(width + 1) - 1e-9) if n > 1 else 0
    ends = 1 if not flaky or width >= 2 else 2
    return ends + probes + (0 if flaky else 1)


@dataclass
class Observed:
    """What the attempts on one commit showed."""

    passes: int = 0
    fails: int = 0
    skipped: str = ""  # why it could not be tested ("" when it was)

    @property
    def attempts(self) -> int:
        return self.passes + self.fails

    def describe(self) -> str:
        if self.skipped:
            return f"skipped ({self.skipped})"
        if not self.fails:
            return f"passed {self.passes}/{self.attempts}"
        if not self.passes:
            return f"failed {self.fails}/{self.attempts}"
        return f"failed {self.fails} of {self.attempts}"


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The answer: what happened at which commit, and how sure it is."""

    kind: Kind
    index: int | None  # the first bad commit (or the first at the new rate); None: undetermined
    candidates: tuple[int, ...]  # commits the answer could be (more than one: skipped neighbours)
    lo: int  # the last commit known good
    hi: int  # the first commit known bad
    mode: Mode
    why: str  # one line


@dataclass
class Search:
    """The state of one bisect: what each tested commit showed, what to test next."""

    n: int  # index of the bad end; the good end is 0
    width: int = 1  # commits tested at once
    k: int = 1  # attempts per commit
    bad_end_known: bool = False  # True: the bad end's failure is taken as given
    seen: dict[int, Observed] = field(default_factory=dict)
    rounds: list[tuple[int, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise UsageError("the range is empty: the bad commit must come after the good one")
        if self.width < 1 or self.k < 1:
            raise UsageError("width and attempts per commit must be at least 1")

    @property
    def flaky(self) -> bool:
        return self.k > 1

    # --- one commit -------------------------------------------------------------------------

    def record(self, index: int, passed: bool | None, why: str = "") -> None:
        """One attempt on a commit: passed, failed, or None (it could not run: skip it)."""
        obs = self.seen.setdefault(index, Observed())
        if passed is None:
            obs.skipped = why or "could not run"
        elif passed:
            obs.passes += 1
        else:
            obs.fails += 1

    def settled(self, index: int) -> bool:
        """No more attempts needed on this commit."""
        obs = self.seen.get(index)
        if obs is None:
            return False
        if obs.skipped or obs.attempts >= self.k:
            return True
        mode = self.mode()
        if index in (0, self.n) or mode is None:
            return obs.passes > 0 and obs.fails > 0  # mixed is settled in either mode
        return obs.passes > 0 if mode == "break" else obs.fails > 0

    # --- the ends and the mode --------------------------------------------------------------

    def mode(self) -> Mode | None:
        """break or rate, once the ends say which; None while they are untested."""
        if not self.flaky:
            return "break"
        end = self.seen.get(self.n)
        if end is None or not self.settled_end(self.n):
            return None
        return "break" if end.passes == 0 else "rate"

    def settled_end(self, index: int) -> bool:
        obs = self.seen.get(index)
        return obs is not None and (bool(obs.skipped) or obs.attempts >= self.k
                                    or (obs.passes > 0 and obs.fails > 0))

    def refusal(self) -> str | None:
        """Why the range cannot be bisected, once its ends were tested; None while it can."""
        good, bad = self.seen.get(0), self.seen.get(self.n)
        if good is not None and good.skipped:
            return f"the good end could not be tested ({good.skipped}); pick a good commit that installs"
        if good is not None and self.settled_end(0) and good.passes == 0:
            return (f"the good end already fails ({good.describe()}): nothing in the range is known "
                    "good; pass an older --good")
        if bad is not None and bad.skipped:
            return f"the bad end could not be tested ({bad.skipped}); pick a bad commit that installs"
        if bad is not None and self.settled_end(self.n) and bad.fails == 0:
            return (f"the bad end passed ({bad.describe()}): nothing to bisect; check the entry "
                    "and --bad")
        if (self.flaky and good is not None and bad is not None and self.settled_end(0)
                and self.settled_end(self.n) and good.fails > 0 and bad.passes > 0):
            return (f"both ends fail only sometimes (good end {good.describe()}, bad end "
                    f"{bad.describe()}): no break and no rise from 0 to find at this confidence")
        return None

    def is_bad(self, index: int) -> bool | None:
        """The commit's verdict under the current mode; None while untested, skipped or unsure."""
        if index == self.n and self.bad_end_known and index not in self.seen:
            return True
        obs = self.seen.get(index)
        mode = self.mode()
        if obs is None or obs.skipped or mode is None or not self.settled(index):
            return None
        if mode == "break":
            return obs.passes == 0
        return obs.fails > 0

    def bounds(self) -> tuple[int, int]:
        """(lo, hi): the first commit known bad, and the last known good before it."""
        bad = [i for i in range(1, self.n + 1) if self.is_bad(i) is True]
        hi = min(bad) if bad else self.n
        good = [i for i in range(0, hi) if i == 0 or self.is_bad(i) is False]
        return max(good), hi

    # --- the next round ---------------------------------------------------------------------

    def next_round(self) -> tuple[int, ...]:
        """Commits to test now (at most `width`); () when the search is over."""
        if self.refusal() is not None:
            return ()
        ends = [0] + ([self.n] if not self.bad_end_known else [])
        batch = [i for i in ends if not self.settled_end(i)]
        # While the ends are untested a flaky entry's mode is open: probes beside them cut
        # the whole range and are run until settled in either mode.
        lo, hi = self.bounds() if self.mode() is not None else (0, self.n)
        free = self.width - len(batch)
        if free > 0:
            batch += _split([i for i in range(lo + 1, hi) if i not in self.seen], free)
        if not batch and hi == self.n and self.n not in self.seen:
            batch = [self.n]  # the answer is the bad end itself: confirm it rather than assume
        batch = sorted(set(batch))[: self.width]
        if batch:
            self.rounds.append(tuple(batch))
        return tuple(batch)

    def unsettled(self, batch: Sequence[int]) -> list[int]:
        return [i for i in batch if not self.settled(i)]

    # --- the answer -------------------------------------------------------------------------

    def verdict(self) -> Verdict:
        lo, hi = self.bounds()
        mode = self.mode() or "break"
        skipped = tuple(i for i in range(lo + 1, hi) if self.seen.get(i, Observed()).skipped)
        unknown = [i for i in range(lo + 1, hi) if i not in self.seen]
        hi_known = self.is_bad(hi) is True
        if unknown or not hi_known:
            return Verdict(kind="undetermined", index=None, candidates=tuple(range(lo + 1, hi + 1)),
                           lo=lo, hi=hi, mode=mode,
                           why=f"the first bad commit lies in {lo + 1}..{hi}; the budget ran out first")
        kind: Kind = "rate-rose" if mode == "rate" else "first-bad"
        return Verdict(kind=kind, index=hi if not skipped else None, candidates=(*skipped, hi),
                       lo=lo, hi=hi, mode=mode,
                       why="" if not skipped else
                       f"{len(skipped)} skipped commit(s) sit between the last good and the first bad")


def _split(unknown: Sequence[int], parts: int) -> list[int]:
    """`parts` commits of `unknown` that cut it into parts + 1 stretches of near-equal length."""
    m = len(unknown)
    if m == 0:
        return []
    if m <= parts:
        return list(unknown)
    picks = [unknown[(j * (m + 1)) // (parts + 1) - 1] for j in range(1, parts + 1)]
    return sorted(set(picks))
