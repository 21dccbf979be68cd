"""Symbolic and numeric equivalence of math answers (sympy, LaTeX parsing, time limit)."""

import sys
import time

import pytest

from slime.rollout.rm_hub import math_utils
from slime.rollout.rm_hub.math_utils import answers_match, grade_math, latex_to_sympy_text

NUM_GPUS = 0


@pytest.mark.parametrize(
    ("pred", "label"),
    [
        ("0.5", r"\frac{1}{2}"),
        (r"2\sqrt{2}", r"\sqrt{8}"),
        ("(x+1)^2", "x^2+2x+1"),
        (r"\frac{\pi}{2}", r"\pi/2"),
        (r"\sqrt[3]{8}", "2"),
        (r"2 \cdot 3", "6"),
        ("1e3", "1000"),
        (r"\left(\frac{1}{2}, 3\right)", "(0.5, 3)"),
    ],
)
def test_equivalent_answers_match(pred, label):
    assert answers_match(pred, label)


@pytest.mark.parametrize(
    ("pred", "label"),
    [
        ("3", "4"),
        (r"\frac{1}{3}", "0.33"),
        ("x^2", "2x"),
        ("(1, 2)", "(2, 1)"),
        ("(1, 2)", "[1, 2]"),
        (r"\sqrt{2}", "1.4142"),
    ],
)
def test_different_answers_do_not_match(pred, label):
    assert not answers_match(pred, label)


def test_none_prediction_never_matches():
    assert not answers_match(None, "3")


def test_grade_math_uses_the_last_box_and_a_boxed_label():
    assert grade_math(r"\boxed{1} no: \boxed{\dfrac{2}{4}}", r"\boxed{\frac{1}{2}}") == 1.0
    assert grade_math(r"\boxed{\dfrac{2}{4}} no: \boxed{1}", r"\frac{1}{2}") == 0.0


def test_code_injection_is_not_evaluated():
    assert latex_to_sympy_text("__import__('os').system('true')") is None
    assert not answers_match("__import__('os')", "0")


def test_huge_exponent_is_refused_not_computed():
    assert latex_to_sympy_text("9^{99999}") is None


def test_slow_symbolic_check_is_cut_by_the_time_limit(monkeypatch):
    def slow(a, b):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            pass
        return True

    monkeypatch.setattr(math_utils, "_sympy_equal", slow)
    start = time.monotonic()
    assert not answers_match("x+1", "1+x+0*y", timeout=0.2)
    assert time.monotonic() - start < 3


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
