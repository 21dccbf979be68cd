"""The bisect's search on its own: rounds, (g+1)-ary splits, skips, k from a flake rate, a
rising rate told apart from a break. Outcomes come from a function of (commit, attempt)
seeded with fixed numbers, so every run of these tests sees the same draws."""

import math
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers

from ci.bisect.search import Search, attempts_for, confidence_of, rounds_bound
from ci.errors import UsageError

NUM_GPUS = 0


def run(search, outcome, skip=()):
    """Drive the search to its end; `outcome(index, attempt)` -> passed."""
    while batch := search.next_round():
        for i in batch:
            attempt = 0
            while not search.settled(i):
                attempt += 1
                search.record(i, None if i in skip else outcome(i, attempt), "does not install")
    return search


def broken_from(first_bad):
    return lambda i, _attempt: i < first_bad


@pytest.mark.parametrize(("width", "most"), [(1, 6), (2, 5), (4, 4)])
def test_every_planted_break_in_32_commits_is_found_within_the_bound(width, most):
    """Binary (width 1) needs ⌈log2 32⌉ probe rounds plus the good end; each free GPU set
    cuts the rounds (log_{g+1}). The answer at the bad end itself costs one more round."""
    for first_bad in range(1, 33):
        s = run(Search(n=32, width=width, bad_end_known=True), broken_from(first_bad))
        v = s.verdict()
        assert (v.kind, v.index) == ("first-bad", first_bad)
        assert len(s.rounds) <= most + (first_bad == 32), (width, first_bad, s.rounds)
        assert all(len(batch) <= width for batch in s.rounds)
        assert len(s.rounds) <= rounds_bound(32, width, flaky=False)


def test_a_wider_round_cuts_the_range_into_equal_parts():
    s = Search(n=32, width=3, bad_end_known=True)
    assert s.next_round() == (0, 10, 21)  # the good end takes one slot; 1..31 in three stretches
    for i in (0, 10, 21):
        s.record(i, True)
    assert s.next_round() == (23, 26, 29)  # 22..31 in four


def test_mean_rounds_fall_with_width():
    means = []
    for width in (1, 2, 4):
        rounds = [len(run(Search(n=32, width=width, bad_end_known=True), broken_from(b)).rounds)
                  for b in range(1, 32)]
        means.append(sum(rounds) / len(rounds))
    assert means[0] > means[1] > means[2], means


def test_the_good_end_is_tested_first_and_a_bad_one_refuses_in_one_step():
    s = run(Search(n=32, bad_end_known=True), lambda i, a: False)
    assert s.rounds == [(0,)]
    assert "the good end already fails" in s.refusal()
    assert "older --good" in s.refusal()


def test_a_bad_end_that_passes_on_confirmation_is_refused():
    s = run(Search(n=8, bad_end_known=True), lambda i, a: True)
    assert s.rounds[-1] == (8,), "an answer at the bad end is confirmed, never assumed"
    assert "the bad end passed" in s.refusal()


def test_a_skipped_commit_is_stepped_around():
    plain = run(Search(n=32, bad_end_known=True), broken_from(20))
    skipped = run(Search(n=32, bad_end_known=True), broken_from(20), skip={16})
    assert 16 in plain.rounds[1] and skipped.seen[16].skipped == "does not install"
    assert (skipped.verdict().kind, skipped.verdict().index) == ("first-bad", 20)


def test_skipped_commits_next_to_the_answer_are_named_with_it():
    s = run(Search(n=32, bad_end_known=True), broken_from(17), skip={16})
    v = s.verdict()
    assert v.index is None and v.candidates == (16, 17), v
    assert "skipped" in v.why


def test_k_holds_the_stated_confidence_and_is_one_without_flakes():
    assert attempts_for(0.0) == 1
    for rate in (0.05, 0.1, 0.2, 0.4, 0.6):
        k = attempts_for(rate, 0.99)
        assert confidence_of(rate, k) >= 0.99 > confidence_of(rate, k - 1)
    assert attempts_for(0.4, 0.99) == math.ceil(math.log(0.01) / math.log(0.6))  # 10: seeing a 40 % rate
    assert attempts_for(0.9, 0.99) == math.ceil(math.log(0.01) / math.log(0.9))  # 44: ruling out chance
    for bad in (1.0, -0.1):
        with pytest.raises(UsageError):
            attempts_for(bad)
    with pytest.raises(UsageError, match="--confidence"):
        attempts_for(0.1, 1.0)


def _flaky_outcome(first_bad, rate_before, rate_after, *, broken_from=None, seed=0):
    def outcome(i, attempt):
        if broken_from is not None and i >= broken_from:
            return False
        rate = rate_after if i >= first_bad else rate_before
        return random.Random(f"{seed}:{i}:{attempt}").random() >= rate
    return outcome


def test_a_rate_rising_from_0_to_40_percent_is_reported_as_such_not_as_a_culprit():
    k = attempts_for(0.4, 0.99)
    hits = 0
    for seed in range(40):
        s = run(Search(n=32, k=k, width=2), _flaky_outcome(11, 0.0, 0.4, seed=seed))
        v = s.verdict()
        assert v.mode == "rate" and v.kind == "rate-rose", (seed, v)
        hits += v.index == 11
    assert hits >= 38, f"{hits}/40 at 99 % per commit"  # a miss needs (0.6)**10 on some commit


def test_a_break_under_a_flaky_baseline_names_the_break_not_a_flake():
    k = attempts_for(0.2, 0.99)
    for seed in range(20):
        s = run(Search(n=32, k=k), _flaky_outcome(0, 0.2, 0.2, broken_from=20, seed=seed))
        v = s.verdict()
        assert (v.mode, v.kind, v.index) == ("break", "first-bad", 20), (seed, v)


def test_flaky_commits_stop_early_once_their_verdict_is_settled():
    """In a break a commit that passed once is sound: it needs no more attempts."""
    k = attempts_for(0.2, 0.99)
    s = run(Search(n=32, k=k), _flaky_outcome(0, 0.0, 0.0, broken_from=20))
    sound = [o.attempts for i, o in s.seen.items() if 0 < i < 20]
    assert k > 1 and sound and set(sound) == {1}, sound  # a pass settles a sound commit
    assert {o.attempts for i, o in s.seen.items() if i >= 20} == {k}  # a break needs all k


def test_ends_that_both_flake_are_refused_with_the_reason():
    k = attempts_for(0.4, 0.99)
    s = run(Search(n=16, k=k), _flaky_outcome(0, 0.4, 0.4, seed=1))
    assert "both ends fail only sometimes" in s.refusal()


def test_a_search_cut_short_gives_the_interval():
    s = Search(n=32, bad_end_known=True)
    for _ in range(2):
        for i in s.next_round():
            s.record(i, i < 20)
    v = s.verdict()
    assert v.kind == "undetermined" and (v.lo, v.hi) == (16, 32)
    assert v.candidates == tuple(range(17, 33))


def test_an_empty_range_is_refused():
    with pytest.raises(UsageError, match="empty"):
        Search(n=0)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
