"""Pure: the figures of `measure` in, one verdict per check out.

Each check lists every condition that failed, with its numbers, so a red row says which
part broke and why. Tolerances are `Limits`; exact equality is asked only where the device
computes deterministically (CPU), and the verdict's note says which held.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CHECK_TITLES: dict[str, str] = {
    "logprobs": "1 engine vs trainer log-probs (fp32, bf16)",
    "grpo": "2 GRPO steps + refit (FSDP2, world 1)",
    "sleep": "3 sleep / wake",
    "resume": "4 checkpoint save + resume",
    "timings": "5 timings",
}


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Tolerances; `fp32_logprob` is what `--ci-test` allows (`--ci-logprob-tol`)."""

    fp32_logprob: float
    # The trainer here runs fp32; a bf16 forward (autocast) against a bf16 engine is held to this.
    bf16_logprob_max: float = 0.15
    bf16_logprob_mean: float = 0.02
    # Same weights, same seeds, same batch: CPU is exact; on CUDA a probe may differ by this.
    probe_logprob: float = 0.0
    # Resume vs the uninterrupted run: 0 is bitwise.
    resume_atol: float = 0.0
    min_tokens_per_s: float = 0.0
    min_steps_per_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """One check: whether it held, a one-line summary of its figures, the failed conditions."""

    name: str
    ok: bool
    summary: str
    failures: tuple[str, ...] = ()
    note: str = ""

    @property
    def title(self) -> str:
        return CHECK_TITLES.get(self.name, self.name)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _error_verdict(name: str, figures: Mapping[str, Any]) -> Verdict | None:
    if "error" in figures:
        return Verdict(name=name, ok=False, summary="did not run to the end",
                       failures=(f"raised {figures['error']}",))
    return None


def judge_logprobs(f: Mapping[str, Any], limits: Limits, device: str) -> Verdict:
    """Per dtype: the gap within tolerance, tensors on the device, the dtype asked for."""
    fails: list[str] = []
    parts = []
    cases = (("fp32", limits.fp32_logprob, limits.fp32_logprob, "torch.float32"),
             ("bf16", limits.bf16_logprob_max, limits.bf16_logprob_mean, "torch.bfloat16"))
    for dtype, tol_max, tol_mean, want in cases:
        d = f.get(dtype)
        if not isinstance(d, Mapping):
            fails.append(f"{dtype}: no figures")
            continue
        parts.append(f"{dtype} max {d['gap_max']:.2e} mean {d['gap_mean']:.2e}")
        if not d.get("tokens"):
            fails.append(f"{dtype}: the engine generated no tokens")
        if not (_finite(d["gap_max"]) and d["gap_max"] <= tol_max):
            fails.append(f"{dtype}: max |engine - trainer| log-prob {d['gap_max']:.3e} > {tol_max:g}")
        if not (_finite(d["gap_mean"]) and d["gap_mean"] <= tol_mean):
            fails.append(f"{dtype}: mean |engine - trainer| log-prob {d['gap_mean']:.3e} > {tol_mean:g}")
        if d.get("engine_dtypes") != [want]:
            fails.append(f"{dtype}: engine weights are {d.get('engine_dtypes')}, expected [{want}]")
        if not str(d.get("engine_device", "")).startswith(device) or d.get("off_device_tensors"):
            fails.append(f"{dtype}: engine on {d.get('engine_device')} with "
                         f"{d.get('off_device_tensors')} tensors off {device}")
    if f.get("trainer_off_device_params"):
        fails.append(f"{f['trainer_off_device_params']} trainer parameters are not on {device}")
    return Verdict(name="logprobs", ok=not fails, summary="; ".join(parts), failures=tuple(fails),
                   note=f"fp32 tolerance {limits.fp32_logprob:g} (--ci-logprob-tol); bf16 "
                        f"{limits.bf16_logprob_max:g} max / {limits.bf16_logprob_mean:g} mean")


def judge_grpo(f: Mapping[str, Any], limits: Limits, expected_steps: int, *, device: str = "cpu",
               backend: str | None = None) -> Verdict:
    """Every step ran and held --ci-test; refits landed; the first step followed the advantages."""
    fails: list[str] = []
    want_backend = "nccl" if device == "cuda" else "gloo"
    if backend is not None and backend != want_backend:
        fails.append(f"the trainer's process group runs {backend}, expected {want_backend} on {device}")
    if f.get("invariant"):
        fails.append(f["invariant"])
    steps: Sequence[Mapping[str, Any]] = f.get("steps", [])
    if len(steps) != expected_steps:
        fails.append(f"{len(steps)} of {expected_steps} steps ran")
    for s in steps:
        want = str(s.get("step", -1) + 1)
        if set(s.get("refit/engine_versions", {}).values()) != {want}:
            fails.append(f"step {s.get('step')}: engines at {s.get('refit/engine_versions')} after "
                         f"refit, trainer at {want}")
    if f.get("engine_version") != str(f.get("trainer_version")):
        fails.append(f"engine serves version {f.get('engine_version')}, trainer is at "
                     f"{f.get('trainer_version')}")
    gap = f.get("refit_gap", {}).get("gap_max", math.nan)
    if not (_finite(gap) and gap <= limits.fp32_logprob):
        fails.append(f"after the last refit max |engine - trainer| log-prob {gap:.3e} > "
                     f"{limits.fp32_logprob:g}")
    gains = f.get("surrogate_gains", [])
    if not gains or not (_finite(gains[0]) and gains[0] > 0):
        fails.append(f"step 0 did not raise the advantage-weighted log-prob (gain "
                     f"{gains[0] if gains else 'missing'}): the update does not follow the policy gradient")
    summary = (f"{len(steps)} steps; reward {f.get('rollout_reward_first', math.nan):.3f} -> "
               f"{f.get('rollout_reward_after', math.nan):.3f}, greedy eval "
               f"{f.get('eval_reward_before', math.nan):.3f} -> {f.get('eval_reward_after', math.nan):.3f}; "
               f"gap after refit {gap:.2e}")
    return Verdict(name="grpo", ok=not fails, summary=summary, failures=tuple(fails),
                   note="--ci-test invariants at every step (step-0 KL, sane log-probs, on-policy ratios, "
                        "engine versions)")


def judge_sleep(f: Mapping[str, Any], limits: Limits, device: str) -> Verdict:
    """Released means gone from the device; resumed means back, with the same generations."""
    fails: list[str] = []
    before, released, after = f["before"], f["released"], f["after"]
    model = before["engine_bytes"]
    if not model > 0:
        fails.append(f"the engine held {model} bytes before release")
    if released["engine_bytes"] != 0 or not f.get("released_flag"):
        fails.append(f"released engine still holds {released['engine_bytes']} bytes on {device}")
    if after["engine_bytes"] != model:
        fails.append(f"resumed engine holds {after['engine_bytes']} bytes, {model} before")
    if device == "cuda":
        drop = before["cuda_allocated"] - released["cuda_allocated"]
        rise = after["cuda_allocated"] - released["cuda_allocated"]
        # The allocator rounds each tensor up (512-byte blocks): freed bytes are at least the model's.
        if drop < model:
            fails.append(f"torch.cuda.memory_allocated fell by {drop} bytes on release, the engine "
                         f"holds {model}")
        if rise < model:
            fails.append(f"torch.cuda.memory_allocated rose by {rise} bytes on resume, the engine "
                         f"holds {model}")
    fails += _probe_failures(f["probe_before"], f["probe_after"], limits.probe_logprob)
    for i, s in enumerate(f.get("loop_steps", [])):
        if any(b != 0 for b in s.get("sleep/bytes_released") or [1]):
            fails.append(f"loop step {i}: engine held {s.get('sleep/bytes_released')} bytes while released")
        if s.get("sleep/bytes_awake") != s.get("sleep/bytes_resumed"):
            fails.append(f"loop step {i}: {s.get('sleep/bytes_awake')} bytes awake, "
                         f"{s.get('sleep/bytes_resumed')} after resume")
        if not s.get("probe_same"):
            fails.append(f"loop step {i}: seeded generations differ before and after sleep")
    held = (f"engine bytes {model} -> {released['engine_bytes']} -> {after['engine_bytes']}")
    if device == "cuda":
        held += (f"; cuda allocated {before['cuda_allocated']} -> {released['cuda_allocated']} -> "
                 f"{after['cuda_allocated']}")
    return Verdict(name="sleep", ok=not fails, summary=held, failures=tuple(fails),
                   note="CPU: the engine's own count of bytes it holds on the device" if device != "cuda"
                   else "torch.cuda.memory_allocated of this process (trainer included), synchronised")


def _probe_failures(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]],
                    tol: float) -> list[str]:
    fails = []
    if len(before) != len(after) or not before:
        return [f"{len(before)} probe generations before sleep, {len(after)} after"]
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        if b["ids"] != a["ids"]:
            fails.append(f"probe {i}: tokens {b['ids']} before sleep, {a['ids']} after (same seed)")
            continue
        worst = max((abs(x - y) for x, y in zip(b["logprobs"], a["logprobs"], strict=True)), default=0.0)
        if worst > tol:
            fails.append(f"probe {i}: log-probs differ by {worst:.3e} after sleep (> {tol:g})")
    return fails


def judge_resume(f: Mapping[str, Any], limits: Limits) -> Verdict:
    """The resumed run ends where the uninterrupted one did: same steps, metrics and weights."""
    fails: list[str] = []
    atol = limits.resume_atol
    if f.get("version_after") != f.get("expected_version"):
        fails.append(f"resumed trainer ended at version {f.get('version_after')}, expected "
                     f"{f.get('expected_version')}")
    if f.get("start_rollout_id") != f.get("resumed_from_step"):
        fails.append(f"resume picked up at rollout {f.get('start_rollout_id')}, saved after "
                     f"{f.get('resumed_from_step')}")
    if f.get("steps_resumed") != f.get("steps_uninterrupted"):
        fails.append(f"{f.get('steps_resumed')} steps after resume, {f.get('steps_uninterrupted')} in the "
                     "uninterrupted run")
    if f.get("missing_keys"):
        fails.append(f"weights differ in names: {f['missing_keys'][:5]}")
    diff = f.get("weights_max_abs_diff", math.nan)
    if not (_finite(diff) and diff <= atol):
        fails.append(f"final weights differ from the uninterrupted run by up to {diff:.3e} (> {atol:g})")
    for i, d in enumerate(f.get("metric_diffs", [])):
        bad = {k: v for k, v in d.items() if not v <= atol}
        if bad:
            fails.append(f"resumed step {i}: {', '.join(f'{k} differs by {v:.3e}' for k, v in bad.items())}")
    bitwise = bool(f.get("weights_bitwise"))
    held = "bitwise" if bitwise else f"within {atol:g}"
    return Verdict(name="resume", ok=not fails,
                   summary=f"from step {f.get('resumed_from_step')}: weights max |diff| {diff:.2e} ({held})",
                   failures=tuple(fails),
                   note=f"tolerance {atol:g}; {'bitwise equality held' if bitwise else 'not bitwise'}")


def judge_timings(f: Mapping[str, Any], limits: Limits) -> Verdict:
    """Every figure measured (finite, > 0), the peak at least what was resident, floors met."""
    fails: list[str] = []
    for key in ("gen_tokens_per_s_fp32", "gen_tokens_per_s_bf16", "rollout_tokens_per_s", "train_steps_per_s",
                "refit_seconds_mean", "peak_bytes"):
        if not (_finite(f.get(key)) and f[key] > 0):
            fails.append(f"{key} = {f.get(key)}: not measured")
    if _finite(f.get("peak_bytes")) and f["peak_bytes"] < f.get("resident_lower_bound_bytes", 0):
        fails.append(f"peak {f['peak_bytes']} bytes is below the {f['resident_lower_bound_bytes']} bytes of "
                     "weights that were resident at once: the peak is not measured on this device")
    for key, floor in (("gen_tokens_per_s_fp32", limits.min_tokens_per_s),
                       ("train_steps_per_s", limits.min_steps_per_s)):
        if _finite(f.get(key)) and f[key] < floor:
            fails.append(f"{key} {f[key]:.1f} < the floor {floor:g}")
    peak: Any = f.get("peak_bytes")
    peak_mib = f"{peak / 2**20:.1f} MiB" if _finite(peak) else "not measured"
    summary = (f"gen {_num(f.get('gen_tokens_per_s_fp32'))} tok/s fp32, "
               f"{_num(f.get('gen_tokens_per_s_bf16'))} bf16; "
               f"train {_num(f.get('train_steps_per_s'), '.2f')} steps/s; peak {peak_mib}")
    return Verdict(name="timings", ok=not fails, summary=summary, failures=tuple(fails),
                   note=str(f.get("peak_kind", "")))


def _num(x: Any, spec: str = ".0f") -> str:
    return format(x, spec) if _finite(x) else "n/a"


def judge_all(figures: Mapping[str, Any], limits: Limits, *, device: str, steps: int) -> list[Verdict]:
    """One verdict per check, in order; a setup that failed fails every check it prevented."""
    env = figures.get("env", {})
    backend = env.get("backend")
    judges: dict[str, Callable[[Mapping[str, Any]], Verdict]] = {
        "logprobs": lambda f: judge_logprobs(f, limits, device),
        "grpo": lambda f: judge_grpo(f, limits, steps, device=device, backend=backend),
        "sleep": lambda f: judge_sleep(f, limits, device),
        "resume": lambda f: judge_resume(f, limits),
        "timings": lambda f: judge_timings(f, limits),
    }
    out = []
    for name, judge in judges.items():
        f = figures.get(name)
        if f is None:
            why = f"setup failed: {env.get('error')}" if env.get("error") else "not measured"
            out.append(Verdict(name=name, ok=False, summary="did not run", failures=(why,)))
            continue
        out.append(_error_verdict(name, f) or _guard(name, judge, f))
    return out


def _guard(name: str, judge: Callable[[Mapping[str, Any]], Verdict], f: Mapping[str, Any]) -> Verdict:
    # Figures missing a key (a check cut short in an unplanned way) fail the check, not the tool.
    try:
        return judge(f)
    except (KeyError, TypeError, ValueError) as exc:
        return Verdict(name=name, ok=False, summary="incomplete figures",
                       failures=(f"figures lack what the check needs: {type(exc).__name__}: {exc}",))
