"""Normalisation of final answers before comparison."""

import sys

import pytest

from slime.rollout.rm_hub.math_utils import answers_match, normalize_answer

NUM_GPUS = 0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (r"\dfrac{3}{4}", r"\frac{3}{4}"),
        (r"\tfrac{3}{4}", r"\frac{3}{4}"),
        (r"\frac34", r"\frac{3}{4}"),
        (r"\frac3{4}", r"\frac{3}{4}"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        ("12 cm", "12"),
        (r"12\text{ cm}", "12"),
        (r"45^\circ", "45"),
        (r"45^{\circ}", "45"),
        (r"30\%", "30"),
        (r"\$5", "5"),
        ("7.", "7"),
        (" 3 x + 1 ", "3x+1"),
        ("x = 5", "5"),
        ("1,234,567", "1234567"),
        (".5", "0.5"),
        (r"\sqrt2", r"\sqrt{2}"),
        (r"3\,000", "3000"),
        (r"$\displaystyle 8$", "8"),
    ],
)
def test_normalize(raw, expected):
    assert normalize_answer(raw) == expected


def test_equation_with_two_sides_keeps_both():
    # Only a lone `var = value` is reduced to its value.
    assert normalize_answer("y = x + 1 = 3") == "y=x+1=3"


def test_commas_of_a_tuple_are_not_thousands_separators():
    assert normalize_answer("(1,234)") == "(1,234)"


def test_words_that_are_not_units_survive():
    assert normalize_answer(r"\text{Tuesday}") == "Tuesday"


@pytest.mark.parametrize(
    ("pred", "label"),
    [
        (r"\dfrac{1}{2}", r"\frac12"),
        ("5 degrees", "5"),
        (r"\left[0, 1\right)", "[0,1)"),
        ("10.", "10"),
    ],
)
def test_normalised_forms_match(pred, label):
    assert answers_match(pred, label)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
