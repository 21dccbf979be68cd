"""DAPO-format reward: `Answer:` line extraction, strict vs lenient, +1/-1 scale."""

import sys

import pytest

from slime.rollout.rm_hub.math_dapo import TAIL_CHARS, extract_answer, grade_dapo

NUM_GPUS = 0


def test_correct_answer_line_scores_plus_one():
    assert grade_dapo("Reasoning...\nAnswer: 42", "42") == 1.0


def test_wrong_answer_scores_minus_one_not_zero():
    assert grade_dapo("Reasoning...\nAnswer: 41", "42") == -1.0


def test_missing_answer_scores_minus_one():
    assert grade_dapo("I have no idea", "42") == -1.0


def test_lenient_takes_the_last_answer_line():
    text = "Answer: 1\nhmm, recheck\nAnswer: 2\nthat is final"
    assert extract_answer(text, strict=False) == "2"


def test_strict_requires_the_answer_on_the_last_line():
    text = "Answer: 42\nand some trailing chatter"
    assert extract_answer(text, strict=True) is None
    assert grade_dapo(text, "42", strict=True) == -1.0
    assert grade_dapo(text, "42", strict=False) == 1.0


def test_strict_accepts_markdown_bold_and_boxes():
    assert extract_answer("work\n**Answer:** $\\boxed{7}$", strict=True) == "7"


def test_lenient_falls_back_to_a_box():
    assert extract_answer(r"so it is \boxed{3}", strict=False) == "3"


def test_case_insensitive_answer_keyword():
    assert extract_answer("ANSWER: 9", strict=True) == "9"


def test_answer_is_normalised_before_comparison():
    assert grade_dapo("Answer: $\\dfrac{1}{2}$.", "0.5") == 1.0


def test_only_the_tail_is_read():
    # An answer line far before the end is the prompt echo, not the model's answer.
    text = "Answer: 42\n" + "x" * (TAIL_CHARS + 10)
    assert extract_answer(text, strict=False) is None


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
