"""The reward graders at their edges: label forms, choice bounds, tuples element by element,
a timeout that is passed on, and the exact words of each refusal."""

import string
import sys

import pytest

from slime.rollout.rm_hub import grade
from slime.rollout.rm_hub.deepscaler import grade_deepscaler
from slime.rollout.rm_hub.f1 import grade_f1
from slime.rollout.rm_hub.gpqa import extract_choice, grade_gpqa, normalize_label
from slime.rollout.rm_hub.math_dapo import extract_answer, grade_dapo
from slime.rollout.rm_hub.math_utils import (
    answers_match,
    grade_math,
    last_boxed,
    latex_to_sympy_text,
    normalize_answer,
)

NUM_GPUS = 0

# A label written as a worked solution: only its boxed answer is the reference.
WORKED = r"Adding the two parts gives \boxed{12}"
# Equal only symbolically: string and number comparison cannot tell, sympy can.
SYMBOLIC = (r"\boxed{x+x}", "2x")


def test_refusals_say_exactly_what_is_wrong():
    with pytest.raises(ValueError) as info:
        grade("mathh", "x", "y")
    assert str(info.value) == "unknown rm_type 'mathh'; pick one of math, dapo, dapo_strict, deepscaler, gpqa, f1, arith"
    with pytest.raises(TypeError) as info:
        grade("math", b"\\boxed{1}", "1")
    assert str(info.value) == "response must be a string, got bytes"
    with pytest.raises(ValueError) as info:
        grade_f1("x", [])
    assert str(info.value) == "f1 needs at least one reference answer"
    with pytest.raises(ValueError) as info:
        normalize_label(4)
    assert str(info.value) == "choice index 4 is outside 0..3"


# --- labels that are more than the answer --------------------------------------------------


def test_a_worked_label_is_reduced_to_its_box():
    assert grade_math(r"so \boxed{12}", WORKED) == 1.0
    assert grade_deepscaler(r"<think>7+5</think> \boxed{12}", WORKED) == 1.0
    assert grade_deepscaler(r"<think>7+5</think> \boxed{12}", [r"\boxed{3}", WORKED]) == 1.0


def test_a_string_label_with_several_characters_is_one_label():
    # Not a list of one-character labels: "12" is twelve, never "1" or "2".
    assert grade_deepscaler(r"</think> \boxed{12}", "12") == 1.0
    assert grade_deepscaler(r"</think> \boxed{2}", "12") == 0.0


# --- the timeout reaches the symbolic comparison -------------------------------------------


def test_the_timeout_given_is_the_one_the_comparison_gets():
    response, label = SYMBOLIC
    assert grade_math(response, label) == 1.0
    assert grade_deepscaler("</think>" + response, label) == 1.0
    assert grade_dapo("Answer: " + response, label) == 1.0
    # Far too short for sympy: the comparison gives up, and a give-up is "not equal".
    assert grade_math(response, label, timeout=1e-6) == 0.0
    assert grade_deepscaler("</think>" + response, label, timeout=1e-6) == 0.0
    assert grade_dapo("Answer: " + response, label, timeout=1e-6) == -1.0


# --- boxes and answer lines -----------------------------------------------------------------


def test_a_one_sided_escaped_brace_stays_inside_its_box():
    # A piecewise or set opening (`\left\{ ... \right.`) has no closing `\}`.
    assert last_boxed(r"\boxed{\left\{ x \right.}") == r"\left\{ x \right."
    assert last_boxed(r"\boxed{a\}b} tail") == r"a\}b"


def test_a_spaced_box_with_nothing_after_it_is_no_answer():
    assert last_boxed("$\\boxed $") is None
    assert last_boxed("\\boxed ") is None


def test_dapo_is_lenient_unless_asked():
    assert grade_dapo("Answer: 42\nthat is all", "42") == 1.0
    assert grade_dapo("Answer: 42\nthat is all", "42", strict=True) == -1.0


def test_dapo_strips_emphasis_but_not_the_answer():
    assert extract_answer("Answer: **7**", strict=False) == "7"
    assert extract_answer("Answer: 2X", strict=False) == "2X"
    assert extract_answer("Answer: X*", strict=True) == "X"


def test_upper_case_names_and_a_final_period():
    assert normalize_answer("X = 5") == "5"
    assert normalize_answer("2X.") == "2X"


# --- LaTeX into sympy's text ---------------------------------------------------------------


def test_nested_fractions_are_rewritten_inside_out():
    assert latex_to_sympy_text(r"\frac{\frac{1}{2}}{3}") == "((((1)/(2)))/(3))"
    assert answers_match(r"\frac{\frac{1}{2}}{3}", r"\frac{1}{6}")


def test_a_macro_sympy_lacks_is_spelled_out_first():
    # `\textit` is none of the macros rewritten here: pylatexenc turns it into its text.
    assert latex_to_sympy_text(r"\textit{x}+\textit{x}") == "x+x"
    assert answers_match(r"\textit{x}+\textit{x}", "2x")


def test_expressions_longer_than_300_characters_are_not_parsed():
    at_limit = "1" + "+1" * 149 + "0"
    assert len(at_limit) == 300
    assert latex_to_sympy_text(at_limit) == at_limit
    assert latex_to_sympy_text(at_limit + "0") is None


# --- multiple choice -----------------------------------------------------------------------


def test_every_letter_of_the_choices_is_read_from_a_box():
    for letter in string.ascii_uppercase:
        assert extract_choice(rf"\boxed{{{letter}}}", choices=string.ascii_uppercase) == letter, letter
        assert extract_choice(rf"\boxed{{({letter})}}", choices=string.ascii_uppercase) == letter, letter


def test_a_box_that_is_no_choice_leaves_the_phrasing_to_decide():
    assert extract_choice(r"The answer is (B). \boxed{E}") == "B"
    assert extract_choice(r"The answer is (B). \boxed{42}") == "B"
    assert extract_choice(r"The answer is (B). \boxed{BC}") == "B"
    assert extract_choice(r"\boxed{E}") is None


def test_choice_indices_start_at_zero_and_end_before_the_count():
    assert normalize_label(0) == "A"
    assert normalize_label(3) == "D"
    for outside in (-1, 4):
        with pytest.raises(ValueError, match=r"outside 0\.\.3"):
            normalize_label(outside)


def test_grading_with_more_choices_than_four():
    assert grade_gpqa("The answer is E", "E", choices="ABCDE") == 1.0
    assert grade_gpqa("The answer is E", 4, choices="ABCDE") == 1.0
    assert grade_gpqa("The answer is D", "E", choices="ABCDE") == 0.0


# --- tuples and intervals, element by element ----------------------------------------------


def test_tuples_differing_in_their_last_element_do_not_match():
    assert not answers_match("(1,2)", "(1,3)")
    assert not answers_match("(1,2,3)", "(1,2,4)")
    assert not answers_match("(1,3)", "(2,3)")  # nor in their first
    assert answers_match("(1,2,3)", "(1,2,3.0)")


def test_tuples_of_upper_case_variables_compare_element_wise():
    assert answers_match(r"(X,\frac{1}{2})", "(X,0.5)")
    assert not answers_match(r"(X,\frac{1}{2})", "(X,0.6)")


def test_nested_tuples_split_at_their_top_level_only():
    assert answers_match("(((1,2),3),4)", "(((1,2),3),4.0)")
    assert not answers_match("(((1,2),3),4)", "(((1,2),3),5)")


def test_one_value_in_brackets_is_no_tuple():
    # `[x]` may be a floor or a one-point interval: only the comparison of the whole decides.
    assert not answers_match(r"[\frac{1}{2}]", "[0.5]")
    assert answers_match(r"[\frac{1}{2}]", r"[\frac12]")


def test_unbalanced_brackets_are_never_compared_element_wise():
    # The first bracket closes before the end: the outer pair is no pair.
    assert not answers_match("(1,2))", "(1.0,2))")
    assert not answers_match("[1,2)]", "[1.0,2)]")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
