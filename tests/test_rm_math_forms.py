"""The many spellings of one math answer: units, spacing and text macros, boxes, LaTeX turned
into sympy text, tuples and sets, and where the comparison draws its numeric line."""

import sys

import pytest

from slime.rollout.rm_hub.math_utils import answers_match, last_boxed, latex_to_sympy_text, normalize_answer

NUM_GPUS = 0

# Every unit word a grader drops from the end of an answer.
UNITS = ("degrees", "degree", "centimeters", "centimeter", "meters", "meter", "kilometers", "inches",
         "inch", "feet", "foot", "units", "unit", "dollars", "dollar", "cents", "hours", "hour",
         "minutes", "minute", "seconds", "second", "square", "sq", "cm", "mm", "km", "kg", "grams",
         "gram", "pounds", "miles", "mile", "mph", "students", "people", "days", "day", "years", "year")


@pytest.mark.parametrize("unit", UNITS)
def test_every_unit_word_is_dropped_in_text_and_in_a_text_macro(unit):
    assert normalize_answer(f"12 {unit}") == "12"
    assert normalize_answer(f"12\\text{{ {unit}}}") == "12"


def test_units_stack_and_take_a_period_but_words_inside_stay():
    assert normalize_answer("5 sq. cm") == "5"
    assert normalize_answer("5 square meters.") == "5"
    assert normalize_answer("centimeters5") == "centimeters5"  # not at the end: kept


@pytest.mark.parametrize(("raw", "expected"), [
    (r"\textbf{5}", "5"), (r"\mbox{ 5 }", "5"), (r"\textrm{7}", "7"), (r"7\mathrm{ meters}", "7"),
    (r"\text {9}", "9"),
    (r"1\!2", "12"), (r"1\,2", "12"), (r"1\;2", "12"), (r"1\:2", "12"), (r"1\ 2", "12"),
    (r"1\quad2", "12"), (r"1\qquad 2", "12"), ("1~2", "12"),
    (r"90^{\circ}", "90"), (r"90^\circ", "90"), (r"90\circ", "90"), (r"5\%", "5"), ("5%", "5"),
    (r"\$3", "3"), ("$3$", "3"), (r"\displaystyle3", "3"),
    ("-.5", "-0.5"), (".25", "0.25"),
    ("abc=4", "4"), ("x_1=4", "4"), ("abcd=4", "abcd=4"), ("1=2", "1=2"),
    ("1,234.5", "1234.5"), ("-12,345", "-12345"), ("12,34", "12,34"), ("1,2345", "1,2345"),
    (r"\frac{a}2", r"\frac{a}{2}"), (r"\sqrt3+\frac12", r"\sqrt{3}+\frac{1}{2}"),
    (r"\left\{1\right\}", r"\{1\}"),
])
def test_normal_forms(raw, expected):
    assert normalize_answer(raw) == expected


@pytest.mark.parametrize(("latex", "text"), [
    (r"\sqrt[3]{8}", "((8)**(1/(3)))"),
    (r"\frac{1}{\sqrt{2}}", "((1)/(sqrt(2)))"),
    (r"2\cdot3", "2 * 3"), (r"2\times3", "2 * 3"), (r"6\div2", "6 / 2"),
    (r"\pi", " pi "), (r"\infty", " oo "),
    (r"\ln{2}", " log (2)"), (r"\log{2}", " log (2)"), (r"\sin{x}", " sin (x)"),
    (r"\cos{x}", " cos (x)"), (r"\tan{x}", " tan (x)"), (r"\exp{1}", " exp (1)"),
    ("x^{2}", "x**(2)"),
])
def test_latex_becomes_sympy_text(latex, text):
    assert latex_to_sympy_text(latex) == text


@pytest.mark.parametrize("latex", [
    "", "   ", "2^{1000}", "2^ ( 12345", "+".join(["1"] * 151), "a__b", "x;y", r"\frac{1}",
])
def test_what_sympy_is_never_given(latex):
    assert latex_to_sympy_text(latex) is None


def test_three_digit_exponents_and_three_hundred_characters_are_still_given():
    assert latex_to_sympy_text("2^{999}") == "2**(999)"
    assert latex_to_sympy_text("+".join(["1"] * 150)) == "+".join(["1"] * 150)  # 299 characters


def test_a_greek_letter_is_spelled_out_for_sympy():
    assert latex_to_sympy_text(r"2\alpha") is None  # pylatexenc writes α: not sympy text
    assert answers_match(r"\frac{\pi}{2}", r"\frac{1}{2}\pi")


@pytest.mark.parametrize(("text", "boxed"), [
    (r"\boxed{a\{b\}c}", r"a\{b\}c"),  # escaped braces do not close the box
    (r"\fbox{3}", "3"),
    (r"\boxed{1} then \fbox{2}", "1"),  # \boxed first, whatever the order
    (r"\boxed 5$ and", "5"),
    (r"x \boxed   7", "7"),
    (r"\boxed  {4}", "4"),
    (r"\boxed{ 6 }", "6"),
    (r"\boxed{}", ""),
    (r"\boxed{3", None),
    (r"\boxed", None),
    (r"\boxedx", None),
    (r"\boxed{1} \boxed{2}", "2"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
])
def test_the_last_box(text, boxed):
    assert last_boxed(text) == boxed


@pytest.mark.parametrize(("a", "b", "same"), [
    ("(1,2)", "(1,2.0)", True),
    ("[1,2]", "[1.0,2]", True),
    (r"\{1,2\}", r"\{1,2.0\}", True),  # sets compare element-wise too
    (r"\{1,3\}", r"\{1,2.0\}", False),
    ("(1,2)", "[1,2]", False),  # open and closed intervals differ
    ("(1,2)", r"\{1,2.0\}", False),
    ("(1,2),(3,4)", "(1,2),(3,4)", True),
    ("(1,2),(3,4)", "(1,2),(3,4.0)", False),  # no element-wise look inside a list of tuples
    ("(1,2,3)", "(1,2)", False),
    ("(1)", "(1.0)", True),  # one element: compared as an expression
    ("1.0000001", "1", True),
    ("1.00001", "1", False),
    ("0", "1e-10", True),
    ("1e-8", "0", False),
    (r"\frac{1}{2}", "0.5", True),
    (r"2\sqrt{2}", r"\sqrt{8}", True),
    ("x^2-1", "(x-1)(x+1)", True),
    ("x+1", "x+2", False),
])
def test_answers_compare_as_numbers_tuples_and_expressions(a, b, same):
    assert answers_match(a, b) is same


def test_no_answer_never_matches():
    assert not answers_match(None, "1")
    assert not answers_match("", "1")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
