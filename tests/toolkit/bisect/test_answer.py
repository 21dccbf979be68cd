"""The bisect's answer: its headline for a break, a rate rise and skipped neighbours, the
history row on SQLite and on a real PostgreSQL server, and the streak issue's body."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers

from ci.bisect.answer import Answer, markdown, post_to_streak_issue, record_answer
from ci.bisect.driver import Attempt, Commit, Outcome, StepPlan
from ci.bisect.search import Search
from ci.history.schema import LATEST
from ci.history.store import open_store

NUM_GPUS = 0
ENTRY = "tests/e2e/test_x.py --mode a|b"
COMMITS = tuple(Commit(sha=f"{i:040x}", subject=f"change {i}" if i != 5 else "Fix | refactor (#9)",
                       author="Dev", pr=9 if i == 5 else None) for i in range(9))


def answer(outcome, *, skip=(), k=1, rate=0.0):
    s = Search(n=8, k=k, bad_end_known=k == 1)
    attempts = []
    while batch := s.next_round():
        for i in batch:
            n = 0
            while not s.settled(i):
                n += 1
                passed = None if i in skip else outcome(i, n)
                s.record(i, passed, "does not install")
                attempts.append(Attempt(index=i, number=n, seconds=2.0,
                                        outcome="skipped" if passed is None else
                                        "passed" if passed else "failed"))
    out = Outcome(search=s, verdict=s.verdict(), refusal=s.refusal(), attempts=tuple(attempts), wall=9.0)
    return Answer(suite="megatron", entry=ENTRY, commits=COMMITS, outcome=out, rate=rate, confidence=0.99,
                  plan=StepPlan(suite="megatron", entry=ENTRY, emulate=True), trigger="monitor", started_at=1.0)


def test_a_break_names_commit_subject_author_and_pr():
    a = answer(lambda i, n: i < 5)
    assert a.headline() == f"first bad commit: {COMMITS[5].sha[:10]} Fix | refactor (#9) (Dev, PR #9)"
    assert a.reproduce().endswith("python -m ci run --suite megatron --only 'tests/e2e/test_x.py --mode a|b' "
                                  "--emulate-gpus")
    md = markdown(a)
    assert "Fix \\| refactor (#9)" in md, "a | in a subject must not split the table row"
    assert md.count("\n| ") == len(a.outcome.search.seen) + 1


def test_a_rate_rise_says_how_the_rate_moved():
    a = answer(lambda i, n: i < 5 or n % 2 == 1, k=10, rate=0.4)
    assert a.kind == "rate-rose"
    assert a.headline().startswith(f"flake rate rose at commit {COMMITS[5].sha[:10]} Fix | refactor (#9)")
    assert "passed 10/10 at" in a.headline() and "failed 1 of 2 there" in a.headline()
    assert "(each verdict at 99% confidence, 10 attempts per commit)" in a.headline()


def test_skipped_neighbours_make_a_list_and_a_narrower_bisect_to_rerun():
    a = answer(lambda i, n: i < 5, skip={4})
    assert a.commit is None and a.headline().startswith(
        f"first bad commit is one of {COMMITS[4].sha[:10]}, {COMMITS[5].sha[:10]}")
    assert a.reproduce().startswith(f"python -m ci bisect --suite megatron --entry '{ENTRY}' "
                                    f"--good {COMMITS[3].sha[:12]} --bad {COMMITS[5].sha[:12]}")


def test_a_search_cut_short_says_so_and_gives_the_interval():
    s = Search(n=8, bad_end_known=True)
    for _ in range(2):
        for i in s.next_round():
            s.record(i, i < 5)
    out = Outcome(search=s, verdict=s.verdict(), refusal=None, attempts=(), wall=1.0,
                  stopped="stopped after 2 rounds (--max-rounds)")
    a = Answer(suite="s", entry="e.py", commits=COMMITS, outcome=out, rate=0.0, confidence=0.99,
               plan=StepPlan(suite="s", entry="e.py"), trigger="cli", started_at=1.0)
    assert a.kind == "undetermined" and a.commit is None
    assert a.headline() == (f"undetermined: the first bad commit lies after {COMMITS[4].sha[:10]} and at or "
                            f"before {COMMITS[8].sha[:10]} (4 commits); stopped after 2 rounds (--max-rounds)")
    assert a.reproduce() == (f"python -m ci bisect --suite s --entry 'e.py' --good {COMMITS[4].sha[:12]} "
                             f"--bad {COMMITS[8].sha[:12]}")




def test_the_answer_is_a_row_of_the_history(store_url):
    from sqlalchemy import select

    from ci.history import schema

    a = answer(lambda i, n: i < 5)
    record_answer(store_url, a)
    with open_store(store_url) as store, store.engine.connect() as conn:
        assert store.version == LATEST
        row = conn.execute(select(schema.bisects)).mappings().one()
    assert (row["kind"], row["commit"], row["entry_id"], row["trigger"]) == (
        "first-bad", COMMITS[5].sha, ENTRY, "monitor")
    assert row["rounds"] == len(a.outcome.search.rounds) and row["steps"] == len(a.outcome.attempts)
    assert row["summary"] == a.headline()


def test_the_streak_issue_body_carries_its_marker(tmp_path):
    a = answer(lambda i, n: i < 5)
    path = post_to_streak_issue(a, tmp_path / "out")
    assert path.name == "tests_e2e_test_x.py_--mode_a_b.md"
    assert path.read_text().startswith(f"<!-- slime-ci:entry={ENTRY} kind=broken-main -->\n### Bisect of")
    data = json.loads(path.with_suffix(".json").read_text())
    assert (data["kind"], data["commit"], data["pr"]) == ("first-bad", COMMITS[5].sha, 9)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
