"""`--ci-test` invariants: each passes on good numbers and fails with one line naming itself and the numbers."""

import sys

import pytest

from slime import invariants as inv

NUM_GPUS = 0

GOOD = {
    "train/ppo_kl_abs_max": 0.0, "train/kl_loss_abs_max": 1e-12, "check/logprob_nonfinite": 0.0,
    "check/logprob_max": -1e-4, "train/entropy_min": 0.3, "train/loss": 0.1, "train/grad_norm": 0.5,
    "check/logprob_abs_diff_max": 2e-6, "check/is_ratio_min": 0.99999, "check/is_ratio_max": 1.00001,
}


def test_good_numbers_pass():
    inv.check_step0(GOOD)
    inv.check_sane(GOOD, 3)
    inv.check_on_policy(GOOD, 3, logprob_tol=1e-3, ratio_band=1e-3)
    inv.check_engine_versions({"http://a": "4", "http://b": "4"}, 4, 3)
    inv.check_lag(1, 1, 2)


@pytest.mark.parametrize(("check", "change", "name", "numbers"), [
    (inv.check_step0, {"train/ppo_kl_abs_max": 1e-6}, "step0-kl", "1.000e-06"),
    (inv.check_step0, {"train/kl_loss_abs_max": 2e-7}, "step0-kl", "2.000e-07"),
    (lambda m: inv.check_sane(m, 5), {"check/logprob_nonfinite": 2.0}, "finite-logprobs", "2 non-finite"),
    (lambda m: inv.check_sane(m, 5), {"check/logprob_max": 0.01}, "logprob-le-0", "1.000e-02"),
    (lambda m: inv.check_sane(m, 5), {"train/entropy_min": 0.0}, "entropy-positive", "0.000e+00"),
    (lambda m: inv.check_sane(m, 5), {"train/loss": float("nan")}, "finite-loss", "nan"),
    (lambda m: inv.check_on_policy(m, 5, logprob_tol=1e-3, ratio_band=1e-3),
     {"check/logprob_abs_diff_max": 0.2}, "rollout-logprobs-match", "2.000e-01"),
    (lambda m: inv.check_on_policy(m, 5, logprob_tol=1e-3, ratio_band=1e-3),
     {"check/is_ratio_max": 1.01}, "importance-ratio-band", "1.010000"),
])
def test_each_violation_names_itself_and_the_numbers(check, change, name, numbers):
    with pytest.raises(inv.InvariantViolation) as info:
        check({**GOOD, **change})
    message = str(info.value)
    assert f"'{name}'" in message and numbers in message
    assert "\n" not in message


def test_engine_on_an_old_version_is_named():
    with pytest.raises(inv.InvariantViolation, match=r"engines report \{'http://b': '3'\}"):
        inv.check_engine_versions({"http://a": "4", "http://b": "3"}, 4, 3)


def test_lag_other_than_expected_fails():
    with pytest.raises(inv.InvariantViolation, match="0 versions old, expected 1"):
        inv.check_lag(0, 1, 4)


def test_the_invariant_exit_code_is_none_of_the_toolkits():
    """`3` meant both "nothing registered" (the toolkit) and "an invariant broke" (the loop)."""
    from ci import errors

    toolkit = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
    assert inv.EXIT_INVARIANT not in toolkit | {5}  # 5: pytest's "no tests collected"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
