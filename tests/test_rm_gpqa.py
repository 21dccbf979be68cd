"""Multiple-choice reward: the choice letter in its common phrasings."""

import sys

import pytest

from slime.rollout.rm_hub.gpqa import extract_choice, grade_gpqa, normalize_label

NUM_GPUS = 0


@pytest.mark.parametrize(
    "response",
    [
        "The answer is (C)",
        "The answer is C.",
        "Answer: C",
        "answer: **C**",
        "Final answer: [C]",
        r"Therefore \boxed{C}",
        r"\boxed{\text{C}}",
        "After elimination, option C is correct.",
        "Reasoning...\n(C)",
        "Reasoning...\n**C**",
        "Reasoning...\nC.",
        "The correct answer is: C",
    ],
)
def test_phrasings_are_read(response):
    assert extract_choice(response) == "C"


def test_the_last_commitment_wins():
    assert extract_choice("The answer is A. Hmm, no. The answer is (D)") == "D"


def test_letters_outside_the_choices_are_ignored():
    assert extract_choice("The answer is E") is None
    assert extract_choice("The answer is E", choices="ABCDE") == "E"


def test_lower_case_prose_is_not_a_choice():
    assert extract_choice("the answer is a bit unclear") is None


def test_no_commitment_gives_none():
    assert extract_choice("I think it depends on the temperature.") is None


@pytest.mark.parametrize(("label", "letter"), [("C", "C"), ("(c)", "C"), ("C) Paris", "C"), (2, "C")])
def test_label_forms(label, letter):
    assert normalize_label(label) == letter


def test_bad_label_is_an_error():
    with pytest.raises(ValueError, match="names none of the choices"):
        normalize_label("Z")
    with pytest.raises(ValueError, match="outside"):
        normalize_label(4)


def test_grade():
    assert grade_gpqa("The answer is (B)", "B") == 1.0
    assert grade_gpqa("The answer is (B)", 2) == 0.0


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
