"""The tiny arithmetic task's reward: exact answers only, through the rm_hub dispatcher."""

import sys

import pytest

from slime.model.arith_data import all_problems, make_records
from slime.rollout.rm_hub import grade

NUM_GPUS = 0


@pytest.mark.parametrize(("response", "label", "expected"), [
    ("7", "7", 1.0), ("12", "12", 1.0), ("0", 0, 1.0),
    ("7 ", "7", 0.0), ("1", "12", 0.0), ("12", "1", 0.0), ("", "0", 0.0), ("-3", "3", 0.0),
])
def test_exact_match(response, label, expected):
    assert grade("arith", response, label) == expected


def test_every_problem_is_graded_right_by_its_own_answer():
    for rec in all_problems():
        a, op, b = rec["prompt"][0], rec["prompt"][1], rec["prompt"][2]
        truth = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert grade("arith", str(truth), rec["label"]) == 1.0
        assert grade("arith", str(truth + 1), rec["label"]) == 0.0


def test_split_is_disjoint_deterministic_and_seeded():
    train, evaluation = make_records(0)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in evaluation}
    assert len(train) + len(evaluation) == len(all_problems()) == 155
    assert make_records(0) == (train, evaluation)
    assert make_records(1) != (train, evaluation)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
