"""`python tools/cuda_check.py --device cpu`: the GPU owner's first command, kept from rotting on CPU.

The tool runs for real in a subprocess (one process: engine, FSDP2 trainer on gloo, the loop's
own functions) and its JSON must say that all five checks held, with the figures that make each
one meaningful. Then the judge is shown the same figures with one thing broken per check and
must fail exactly that check, saying why; and bad input exits 2 with one line.
"""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

NUM_GPUS = 0
ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "cuda_check.py"
ENV = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _run(*args, timeout=600):
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV, cwd=ROOT)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("cuda_check") / "figures.json"
    proc = _run("--device", "cpu", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc, json.loads(out.read_text())


def test_every_check_holds_on_cpu_and_the_table_says_so(result):
    proc, doc = result
    assert doc["ok"] is True
    assert {n: c["ok"] for n, c in doc["checks"].items()} == dict.fromkeys(
        ("logprobs", "grpo", "sleep", "resume", "timings"), True)
    assert "5 of 5 checks held" in proc.stdout
    for title in ("1 engine vs trainer log-probs", "2 GRPO steps", "3 sleep / wake", "4 checkpoint", "5 timings"):
        assert title in proc.stdout


def test_the_run_was_the_real_path_on_a_process_group_of_one(result):
    env = result[1]["figures"]["env"]
    assert (env["backend"], env["world_size"], env["device"]) == ("gloo", 1, "cpu")
    assert env["engine_model_bytes"] > 0 and env["trainer_param_bytes"] > 0


def test_log_probs_agree_per_dtype_within_what_ci_test_allows(result):
    doc = result[1]
    f, limits = doc["figures"]["logprobs"], doc["options"]["limits"]
    assert limits["fp32_logprob"] == f["ci_logprob_tol"] == 1e-3
    assert f["fp32"]["engine_dtypes"] == ["torch.float32"] and f["bf16"]["engine_dtypes"] == ["torch.bfloat16"]
    assert 0 <= f["fp32"]["gap_max"] <= 1e-3
    # bf16 rounds: its gap is real (well above fp32's) and still inside its own tolerance.
    assert f["fp32"]["gap_max"] < f["bf16"]["gap_max"] <= limits["bf16_logprob_max"]
    assert f["fp32"]["tokens"] > 0 and f["bf16"]["tokens"] > 0


def test_grpo_steps_ran_through_the_loop_and_every_refit_landed(result):
    f = result[1]["figures"]["grpo"]
    assert [s["step"] for s in f["steps"]] == [0, 1, 2, 3]
    assert [s["refit/engine_versions"] for s in f["steps"]] == [{"local://actor-0": str(i)} for i in (1, 2, 3, 4)]
    assert "invariant" not in f
    assert f["surrogate_gains"][0] > 0
    assert f["refit_gap"]["gap_max"] <= 1e-3
    assert 0 < f["rollout_reward_first"] < 1  # the warm-up left room both ways


def test_sleep_released_every_byte_and_wake_gave_the_same_generations(result):
    f = result[1]["figures"]["sleep"]
    assert f["before"]["engine_bytes"] == f["after"]["engine_bytes"] > 0
    assert f["released"]["engine_bytes"] == 0
    assert f["probe_before"] == f["probe_after"]
    assert len(f["loop_steps"]) == 4 and all(s["probe_same"] for s in f["loop_steps"])


def test_resume_is_bitwise_the_uninterrupted_run_on_cpu(result):
    f = result[1]["figures"]["resume"]
    assert f["weights_bitwise"] is True and f["weights_max_abs_diff"] == 0.0
    assert (f["resumed_from_step"], f["steps_resumed"], f["version_after"]) == (2, 2, 4)
    assert all(v == 0.0 for d in f["metric_diffs"] for v in d.values())


# ---- the judge fails the check whose figure is broken, and says why ------------------------
def _break_fp32_gap(f):
    f["logprobs"]["fp32"]["gap_max"] = 2e-3


def _break_bf16_dtype(f):
    f["logprobs"]["bf16"]["engine_dtypes"] = ["torch.float32"]


def _break_refit(f):
    f["grpo"]["steps"][2]["refit/engine_versions"] = {"local://actor-0": "2"}


def _break_gain(f):
    f["grpo"]["surrogate_gains"][0] = -1e-3


def _break_backend(f):
    f["env"]["backend"] = "nccl"


def _break_release(f):
    f["sleep"]["released"]["engine_bytes"] = 4096


def _break_probe(f):
    f["sleep"]["probe_after"][1]["ids"] = [0]


def _break_resume(f):
    f["resume"]["weights_max_abs_diff"] = 1e-7


def _break_peak(f):
    f["timings"]["peak_bytes"] = 1024


BREAKS = [
    (_break_fp32_gap, "logprobs", "fp32: max |engine - trainer| log-prob 2.000e-03 > 0.001"),
    (_break_bf16_dtype, "logprobs", "bf16: engine weights are ['torch.float32'], expected [torch.bfloat16]"),
    (_break_refit, "grpo", "step 2: engines at {'local://actor-0': '2'} after refit, trainer at 3"),
    (_break_gain, "grpo", "step 0 did not raise the advantage-weighted log-prob"),
    (_break_backend, "grpo", "the trainer's process group runs nccl, expected gloo on cpu"),
    (_break_release, "sleep", "released engine still holds 4096 bytes on cpu"),
    (_break_probe, "sleep", "probe 1: tokens"),
    (_break_resume, "resume", "final weights differ from the uninterrupted run by up to 1.000e-07 (> 0)"),
    (_break_peak, "timings", "peak 1024 bytes is below the"),
]


@pytest.mark.parametrize(("breaker", "check", "why"), BREAKS, ids=[b[0].__name__ for b in BREAKS])
def test_a_broken_figure_fails_its_check_and_only_it(result, breaker, check, why):
    from slime.device_check.judge import Limits, judge_all

    doc = result[1]
    figures = copy.deepcopy(doc["figures"])
    breaker(figures)
    verdicts = {v.name: v for v in judge_all(figures, Limits(**doc["options"]["limits"]), device="cpu", steps=4)}
    assert not verdicts[check].ok
    assert any(why in line for line in verdicts[check].failures), verdicts[check].failures
    assert all(v.ok for name, v in verdicts.items() if name != check)


def test_a_check_that_raised_fails_with_the_error_and_the_rest_still_judged(result):
    from slime.device_check.judge import Limits, judge_all

    doc = result[1]
    figures = copy.deepcopy(doc["figures"])
    figures["resume"] = {"error": "CheckpointError: step 2 has no complete checkpoint (checkpoint.py:262)"}
    verdicts = judge_all(figures, Limits(**doc["options"]["limits"]), device="cpu", steps=4)
    assert [v.name for v in verdicts if not v.ok] == ["resume"]
    assert verdicts[3].failures == ("raised CheckpointError: step 2 has no complete checkpoint (checkpoint.py:262)",)


# ---- bad input: exit 2, one line, nothing written ------------------------------------------
@pytest.mark.parametrize(("args", "says"), [
    (("--device", "cpu", "--steps", "1"), "--steps 1: at least 2"),
    (("--device", "cpu", "--samples-per-prompt", "1"), "--samples-per-prompt must be >= 2"),
    (("--device", "cpu", "--resume-atol", "-1"), "--resume-atol must be >= 0"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, says):
    out = tmp_path / "out.json"
    proc = _run(*args, "--json", str(out), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and says in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_dry_run_names_device_sizes_and_tolerances_and_runs_nothing(tmp_path):
    out = tmp_path / "out.json"
    proc = _run("--device", "cpu", "--dry-run", "--json", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "would run on cpu (process group gloo, world size 1)" in proc.stdout
    assert "fp32_logprob=0.001" in proc.stdout and "resume_atol=0.0" in proc.stdout
    assert not out.exists() and "step 0" not in proc.stdout


def test_cuda_asked_for_where_there_is_none_exits_2():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --device cuda is valid input here")
    proc = _run("--device", "cuda", timeout=120)
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert "\n" not in line and "sees no CUDA device" in line and "--device cpu" in line, line


def test_a_missing_package_exits_2_naming_it(tmp_path):
    # A GPU box without transformers: one line naming it, not an ImportError traceback.
    (tmp_path / "transformers.py").write_text('raise ImportError("absent", name="transformers")\n')
    proc = subprocess.run([sys.executable, str(TOOL), "--device", "cpu"], capture_output=True, text=True,
                          timeout=120, env={**ENV, "PYTHONPATH": str(tmp_path)}, cwd=ROOT)
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert "\n" not in line and "cannot import transformers" in line, line


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
