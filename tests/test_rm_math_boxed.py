"""Extraction of the final boxed answer: the last box wins, braces nest, truncation gives nothing."""

import sys

import pytest

from slime.rollout.rm_hub.math_utils import last_boxed

NUM_GPUS = 0


def test_last_box_wins_over_earlier_drafts():
    text = r"First try \boxed{3}. Wait, recheck: the answer is \boxed{4}."
    assert last_boxed(text) == "4"


def test_nested_braces_are_kept_whole():
    assert last_boxed(r"so \boxed{\frac{1}{\sqrt{2}}} done") == r"\frac{1}{\sqrt{2}}"


def test_escaped_braces_do_not_close_the_box():
    assert last_boxed(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"


def test_fbox_is_the_fallback_when_no_boxed():
    assert last_boxed(r"answer: \fbox{7}") == "7"


def test_boxed_is_preferred_over_a_later_fbox():
    assert last_boxed(r"\boxed{1} and then \fbox{2}") == "1"


@pytest.mark.parametrize(
    "text",
    [
        r"the answer is \boxed{12",  # response cut by the length limit
        r"\boxed{\frac{1}{2}",
        "no box at all",
        r"\boxed",
        "",
    ],
)
def test_unterminated_or_missing_box_gives_no_answer(text):
    assert last_boxed(text) is None


def test_unterminated_last_box_does_not_fall_back_to_an_earlier_one():
    # Guessing the earlier draft would reward a truncated response.
    assert last_boxed(r"\boxed{5} then \boxed{6") is None


def test_space_form_takes_the_next_token():
    assert last_boxed(r"$\boxed 42$") == "42"


def test_whitespace_inside_box_is_trimmed():
    assert last_boxed(r"\boxed{  9 }") == "9"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
