"""The learning checks of the RL entries: the paired gain's arithmetic, its common random numbers
(the same policy twice gives exactly no gain), the entries' bounds, and the separation table."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "e2e"), str(ROOT / "benchmarks")]

import _learning as L  # noqa: E402

from slime.rollout.generate import RolloutSpec  # noqa: E402
from slime.rollout.paired import PAIRED_ROLLOUT_ID, PairedGain, prompt_rewards  # noqa: E402
from slime.rollout.source import Prompt  # noqa: E402
from slime.utils.arguments import ArgumentsError, build_parser, check_training_path  # noqa: E402

NUM_GPUS = 0


def test_paired_gain_is_the_mean_per_prompt_difference_with_its_standard_error():
    gain = PairedGain.of([0.0, 0.5, 0.25, 1.0], [0.25, 0.5, 0.75, 1.0], samples_per_prompt=4)
    assert (gain.before, gain.after, gain.gain) == (0.4375, 0.625, 0.1875)
    # differences 0.25, 0, 0.5, 0: sample variance 0.0572916…, over 4 prompts
    assert gain.stderr == pytest.approx((0.0572916666 / 4) ** 0.5, rel=1e-6)
    assert gain.as_dict()["paired/gain"] == 0.1875 and gain.as_dict()["paired/prompts"] == 4.0
    with pytest.raises(ValueError, match="same prompts"):
        PairedGain.of([0.0, 1.0], [0.0], samples_per_prompt=1)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from slime.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=3)


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_dir).eval(), AutoTokenizer.from_pretrained(tiny_dir)


def _clients(model, tokenizer, n=2):
    from _inproc import _Client

    return [_Client(model, tokenizer, [0]) for _ in range(n)]


PROMPTS = [Prompt(index=3 * a + b, text=f"{a}+{b}=", label=str(a + b)) for a in range(4) for b in range(3)]


def test_the_same_policy_twice_gains_exactly_nothing(tiny):
    # Common random numbers: same prompts, same seeds, same weights -> the very same samples.
    model, tok = tiny
    spec = RolloutSpec(n_samples_per_prompt=4, max_new_tokens=3, stop_token_ids=(tok.eos_token_id,), seed=7)
    before = prompt_rewards(_clients(model, tok), tok, PROMPTS, spec)
    after = prompt_rewards(_clients(model, tok, n=1), tok, PROMPTS, spec)  # another engine split
    gain = PairedGain.of(before, after, 4)
    assert gain.gain == 0.0 and gain.stderr == 0.0


def test_paired_seeds_are_none_of_a_runs_rollouts_or_evaluations():
    from slime.rollout.generate import sample_seed

    paired = {sample_seed(1234, PAIRED_ROLLOUT_ID, p) for p in range(1000)}
    used = {sample_seed(1234, r, p) for r in range(-40, 40) for p in range(1000)}
    assert not paired & used


def _parse(model, data, *extra):
    args = build_parser().parse_args(["--hf-checkpoint", str(model), "--prompt-data", str(data), "--num-gpus", "1",
                                      "--colocate", "--num-rollout", "2", "--rollout-batch-size", "4", *extra])
    return check_training_path(args, {})


def test_the_flag_is_checked(tiny_dir, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "1+1=", "label": "2"}\n')
    assert _parse(tiny_dir, data, "--ci-paired-eval-samples", "8").ci_paired_eval_samples == 8
    with pytest.raises(ArgumentsError, match="must be >= 0"):
        _parse(tiny_dir, data, "--ci-paired-eval-samples", "-1")


def test_bounds_pass_and_fail_where_they_say():
    rows = [{"train/value_loss": v} for v in (0.2, 0.2, 0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1)]
    assert L.value_loss_ratio(rows, {}) == pytest.approx(0.5)
    assert L.failures((L.GRPO_GAIN, L.PPO_VALUE), rows, {"paired/gain": L.GRPO_GAIN.bound}) == []
    missed = L.failures((L.GRPO_GAIN, L.PPO_VALUE), rows[:5] * 2, {"paired/gain": L.GRPO_GAIN.bound - 1e-3})
    assert [m.split(" ")[0] for m in missed] == ["paired", "value"] and "needs >=" in missed[0]


def test_the_table_flags_a_broken_run_that_passes_and_reports_the_gap():
    import learning

    def result(variant, gain, seed=1):
        return {"entry": "grpo", "capability": "default", "seed": seed, "variant": variant,
                "values": {L.GRPO_GAIN.name: gain}, "first5": 0.5, "last5": 0.6, "seconds": 1.0}

    lines, ok = learning.table([result("healthy", 0.09), result("healthy", 0.07, 2), result("sign", -0.4),
                                result("zero", 0.0)])
    assert ok
    summary = [ln for ln in lines if ln.startswith("grpo  paired reward gain")]
    assert summary and "+0.0700" in summary[0] and "+0.0000" in summary[0] and summary[0].endswith("yes")
    _, ok = learning.table([result("healthy", 0.09), result("zero", L.GRPO_GAIN.bound + 0.01)])
    assert not ok


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))


def _pinned(code: str, **env: str) -> list[str]:
    import os
    import subprocess

    clean = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "SLIME_CI_EMULATE_GPUS")}
    proc = subprocess.run([sys.executable, "-c", "import _rl, os\n" + code], cwd=ROOT / "tests" / "e2e",
                          env={**clean, **env}, capture_output=True, text=True, timeout=120, check=True)
    return proc.stdout.split()


def test_emulated_learning_entries_run_under_a_kernel_set_their_bounds_were_measured_on():
    show = "print(_rl.pin_cpu_capability([]), os.environ.get('ATEN_CPU_CAPABILITY'))"
    # This CPU, for real: AVX-512 hosts get AVX2, the others keep their own set.
    native = _pinned("print(_rl.native_cpu_capability())")[0]
    pinned = _pinned(show, SLIME_CI_EMULATE_GPUS="1")
    assert pinned[-2:] == (["None", "None"] if native in ("default", "avx2") else ["avx2", "avx2"])
    # An AVX-512 CPU whatever this one is (cpu_offers_avx512 replaced: the stand-in for it).
    fake = "_rl.cpu_offers_avx512 = lambda: True\n"
    assert _pinned(fake + show, SLIME_CI_EMULATE_GPUS="1")[-2:] == ["avx2", "avx2"]
    assert _pinned(fake + show)[-2:] == ["None", "None"]  # real GPUs: nothing pinned
    assert _pinned(fake + show, SLIME_CI_EMULATE_GPUS="1", ATEN_CPU_CAPABILITY="default")[-2:] == ["None", "default"]
    # An explicit --cpu-capability still wins.
    assert _pinned(fake + "print(_rl.pin_cpu_capability(['--cpu-capability', 'default']))",
                   SLIME_CI_EMULATE_GPUS="1")[-1] == "default"
