"""Token-level F1 with SQuAD-style normalisation."""

import sys

import pytest

from slime.rollout.rm_hub.f1 import f1_score, grade_f1, normalize_text

NUM_GPUS = 0


def test_normalisation_drops_case_punctuation_articles():
    assert normalize_text("The  Eiffel Tower, in PARIS!") == "eiffel tower in paris"


def test_identical_answers_score_one():
    assert f1_score("Paris", "paris.") == 1.0


def test_partial_overlap_is_harmonic_mean_of_precision_and_recall():
    # pred tokens: [new, york, city] ref: [new, york]; P = 2/3, R = 1
    assert f1_score("New York City", "new york") == pytest.approx(0.8)


def test_token_multiplicity_counts():
    # pred [yes yes yes], ref [yes]: one common token, P = 1/3, R = 1
    assert f1_score("yes yes yes", "yes") == pytest.approx(0.5)


def test_repeated_tokens_match_as_often_as_both_sides_have_them():
    # overlap of [yes yes] and [yes yes no] is 2 tokens: P = 1, R = 2/3
    assert f1_score("yes yes", "yes yes no") == pytest.approx(0.8)


def test_disjoint_answers_score_zero():
    assert f1_score("London", "Paris") == 0.0


def test_empty_cases():
    assert f1_score("", "") == 1.0
    assert f1_score("the", "a") == 1.0  # both normalise to nothing
    assert f1_score("", "Paris") == 0.0


def test_best_of_several_labels():
    assert grade_f1("New York", ["NYC", "New York City"]) == pytest.approx(0.8)


def test_no_labels_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        grade_f1("x", [])


def test_symmetry():
    assert f1_score("a b c d", "b c") == f1_score("b c", "a b c d")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
