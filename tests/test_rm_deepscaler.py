"""DeepScaler reward: reasoning must be closed, the boxed answer after it must be right."""

import sys

import pytest

from slime.rollout.rm_hub.deepscaler import grade_deepscaler

NUM_GPUS = 0


def test_closed_reasoning_and_right_answer():
    assert grade_deepscaler(r"<think>2+2</think> The answer is \boxed{4}.", "4") == 1.0


def test_missing_think_end_is_a_format_failure_even_if_right():
    assert grade_deepscaler(r"<think>2+2 ... \boxed{4}", "4") == 0.0


def test_box_inside_reasoning_does_not_count():
    assert grade_deepscaler(r"<think>\boxed{4}</think> so that's it", "4") == 0.0


def test_wrong_answer_after_reasoning():
    assert grade_deepscaler(r"<think>..</think> \boxed{5}", "4") == 0.0


def test_any_of_several_labels():
    assert grade_deepscaler(r"</think> \boxed{0.5}", ["1/3", r"\frac{1}{2}"]) == 1.0


def test_boxed_label_is_unwrapped():
    assert grade_deepscaler(r"</think> \boxed{7}", r"\boxed{7}") == 1.0


def test_only_text_after_the_last_think_end_counts():
    text = r"<think>a</think> \boxed{4} <think>b</think> no box here"
    assert grade_deepscaler(text, "4") == 0.0


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
