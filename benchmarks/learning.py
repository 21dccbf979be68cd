"""The separation table of the RL entries' learning checks: entry × CPU capability × seed,
healthy and with the planted break each check guards.

    python benchmarks/learning.py [--entry grpo ppo] [--capability default avx2 avx512]
                                  [--seeds 1234 1 2 3 4] [--no-breaks] [-j 2] [--json RESULTS.jsonl]
    python benchmarks/learning.py --from-json RESULTS.jsonl [...]     # reprint a saved table
    python benchmarks/learning.py --from-json benchmarks/learning.jsonl   # the runs the bounds rest on
    python benchmarks/learning.py --json benchmarks/learning.jsonl      # complete it (runs there are kept)

For each CPU capability (`ATEN_CPU_CAPABILITY`: torch picks its vector kernels by it, so the
float rounding differs, and a chaotic RL run diverges from the first differing sample) it
builds and warms up the tiny model under that capability, as an entry's `prepare()` does,
then runs each entry's training loop at the entry's exact arguments (read from the test
file's `TRAIN_ARGS`) once per seed, healthy and with each planted break:

  grpo  sign   the GRPO advantage's sign flipped (the policy is pushed away from right answers)
        zero   every advantage 0 (the stall a vanishing advantage would cause)
  ppo   sign   the GAE advantage's sign flipped
        critic the critic's optimiser step dropped (its value head never learns)

The loop runs in one process per run (`tests/e2e/_inproc.py`: the same argument parsing,
rollout, reward, GRPO/GAE and `TrainRank.train` as `train.py`, one trainer rank instead of
the entry's data-parallel ranks, no Ray or HTTP), ~15 s a run instead of ~70 s. Each checked
quantity is computed by the function the entry's `check()` uses (`tests/e2e/_learning.py`).
The table ends with, per quantity, the worst healthy and the best broken value and the gap
between them; the exit status is 1 when any healthy run fails or any broken run passes.
Capabilities the CPU lacks (avx512 on an AVX2 machine) are skipped, and said so.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
E2E = ROOT / "tests" / "e2e"
sys.path[:0] = [str(ROOT), str(E2E)]

import _learning as L  # noqa: E402

ENTRY_FILES = {"grpo": "test_rl_grpo_colocated.py", "ppo": "test_rl_ppo_critic.py"}
BREAKS = {"grpo": ("sign", "zero"), "ppo": ("sign", "critic")}
QUANTITIES = {"grpo": (L.GRPO_GAIN,), "ppo": (L.PPO_GAIN, L.PPO_VALUE)}
# Which break each quantity is meant to catch (a reward check is not asked to catch a lazy critic).
GUARDS = {("grpo", L.GRPO_GAIN.name): ("sign", "zero"), ("ppo", L.PPO_GAIN.name): ("sign",),
          ("ppo", L.PPO_VALUE.name): ("critic",)}
DEFAULT_SEEDS = (1234, 1, 2, 3, 4)


def entry_constants(entry: str) -> dict[str, Any]:
    """NUM_GPUS and TRAIN_ARGS of an entry, read from its file without importing it."""
    tree = ast.parse((E2E / ENTRY_FILES[entry]).read_text())
    out: dict[str, Any] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id in ("NUM_GPUS", "TRAIN_ARGS"):
            out[target.id] = ast.literal_eval(node.value)  # type: ignore[union-attr]
    return out


# ---- one run (a child process, under its capability) ------------------------------------------

def _plant(name: str) -> Any:
    """A patch of the trainer for the break `name` (None: healthy)."""
    import slime.backends.fsdp.math as M

    if name == "healthy":
        return None
    if name in ("sign", "zero"):
        scale = -1.0 if name == "sign" else 0.0
        grpo, ppo = M.grpo_token_advantages, M.ppo_advantages

        def grpo_broken(*a: Any, **k: Any) -> Any:
            return [t * scale for t in grpo(*a, **k)]

        def ppo_broken(*a: Any, **k: Any) -> Any:
            adv, ret = ppo(*a, **k)
            return [t * scale for t in adv], ret

        M.grpo_token_advantages, M.ppo_advantages = grpo_broken, ppo_broken
        return None
    if name == "critic":
        def drop_critic_step(rank: Any) -> None:
            rank.critic_optimizer.step = lambda *a, **k: None
        return drop_critic_step
    raise ValueError(f"unknown break {name!r}")


def run_one(entry: str, seed: int, variant: str, model_dir: str, data_dir: str) -> dict[str, Any]:
    """Train once in this process; the checked quantities and a few per-step numbers."""
    from _inproc import run_loop

    const = entry_constants(entry)
    argv = ["--hf-checkpoint", model_dir, "--prompt-data", str(Path(data_dir) / "train.jsonl"),
            "--rm-type", "arith", "--num-gpus", str(const["NUM_GPUS"]), "--rollout-max-response-len", "4",
            "--rollout-shuffle", *const["TRAIN_ARGS"], "--seed", str(seed)]
    patch = _plant(variant)
    start = time.monotonic()
    run = run_loop(argv, model_dir=Path(model_dir), num_engines=const["NUM_GPUS"], patch=patch)
    assert run.paired is not None
    paired = run.paired.as_dict()
    values = {q.name: q.read(run.rows, paired) for q in QUANTITIES[entry]}
    rewards = [r["rollout/reward_all"] for r in run.rows]
    return {"entry": entry, "seed": seed, "variant": variant, "values": values, "paired": paired,
            "first5": sum(rewards[:5]) / 5, "last5": sum(rewards[-5:]) / 5,
            "seconds": time.monotonic() - start}


def prepare(cache: Path) -> dict[str, str]:
    """Build and warm up the tiny model and data (in this process's capability)."""
    from slime.model.prepare import prepare_tiny_assets

    assets = prepare_tiny_assets(cache, seed=0)
    return {"model": str(assets.model_snapshot), "data": str(assets.dataset_snapshot)}


# ---- the table ------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Job:
    capability: str
    entry: str
    seed: int
    variant: str


def _child(argv: Sequence[str], capability: str, timeout: float) -> dict[str, Any]:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "PYTHONPATH": str(ROOT),
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TQDM_DISABLE": "1"}
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        proc = subprocess.run([sys.executable, __file__, *argv, "--result", out.name], env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(argv)} under {capability} exited {proc.returncode}:\n"
                               f"{proc.stderr[-3000:]}")
        return dict(json.loads(Path(out.name).read_text()))


ORDER = ("default", "avx2", "avx512")


def native_capability() -> str:
    """The highest capability torch picks on this CPU (ATEN_CPU_CAPABILITY unset)."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip().lower()


def supported(capability: str, native: str) -> bool:
    """Whether this CPU can run `capability`: torch does not fall back, it dies of SIGILL."""
    return capability in ORDER and native in ORDER and ORDER.index(capability) <= ORDER.index(native)


def table(results: Sequence[dict[str, Any]]) -> tuple[list[str], bool]:
    """Rows of the table and the separation summary; ok is False on any misclassified run."""
    lines = [f"{'entry':5} {'capability':10} {'seed':>5} {'variant':8} {'quantity':22} {'value':>8} "
             f"{'bound':>8} {'verdict':7} {'first5->last5':>14} {'s':>5}"]
    ok = True
    for r in sorted(results, key=lambda r: (r["entry"], r["capability"], r["variant"] != "healthy",
                                            r["variant"], r["seed"])):
        for q in QUANTITIES[r["entry"]]:
            value = r["values"][q.name]
            guarded = r["variant"] == "healthy" or r["variant"] in GUARDS[(r["entry"], q.name)]
            if not guarded:
                continue
            passed = q.passes(value)
            right = passed == (r["variant"] == "healthy")
            ok &= right
            verdict = ("pass" if passed else "fail") + ("" if right else " !!")
            lines.append(f"{r['entry']:5} {r['capability']:10} {r['seed']:>5} {r['variant']:8} {q.name:22} "
                         f"{value:+8.4f} {q.bound:+8.4f} {verdict:7} "
                         f"{r['first5']:.3f}->{r['last5']:.3f} {r['seconds']:5.1f}")
    lines.append("")
    lines.append(f"{'entry':5} {'quantity':22} {'worst healthy':>14} {'best broken':>12} {'bound':>8} "
                 f"{'gap':>8}  separated")
    for entry, quantities in QUANTITIES.items():
        for q in quantities:
            sign = 1.0 if q.higher_is_better else -1.0
            healthy = [r["values"][q.name] for r in results if r["entry"] == entry and r["variant"] == "healthy"]
            broken = [r["values"][q.name] for r in results
                      if r["entry"] == entry and r["variant"] in GUARDS[(entry, q.name)]]
            if not healthy or not broken:
                continue
            worst = min(healthy, key=lambda v: sign * v)
            best = max(broken, key=lambda v: sign * v)
            gap = sign * (worst - best)
            lines.append(f"{entry:5} {q.name:22} {worst:+14.4f} {best:+12.4f} {q.bound:+8.4f} {gap:+8.4f}  "
                         f"{'yes' if gap > 0 and q.passes(worst) and not q.passes(best) else 'NO'}")
    lines.append("")
    lines.append("the check these replace, mean rollout reward of the last 5 steps minus the first 5 "
                 f"(GRPO >= {OLD_MARGIN['grpo']}, PPO >= {OLD_MARGIN['ppo']}), on the same runs:")
    for entry, margin in OLD_MARGIN.items():
        for variant in ("healthy", *BREAKS[entry]):
            runs = [r for r in results if r["entry"] == entry and r["variant"] == variant]
            if runs:
                passed = sum(r["last5"] - r["first5"] >= margin for r in runs)
                gains = sorted(r["last5"] - r["first5"] for r in runs)
                lines.append(f"  {entry:5} {variant:8} passes {passed}/{len(runs)}  "
                             f"(last5 - first5 from {gains[0]:+.3f} to {gains[-1]:+.3f})")
    return lines, ok


# The rollout-window margins the entries asserted before the paired check.
OLD_MARGIN = {"grpo": 0.1, "ppo": 0.05}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entry", nargs="+", choices=sorted(ENTRY_FILES), default=sorted(ENTRY_FILES))
    p.add_argument("--capability", nargs="+", default=["default", "avx2", "avx512"])
    p.add_argument("--seeds", nargs="+", type=int, default=list(DEFAULT_SEEDS))
    p.add_argument("--no-breaks", action="store_true", help="healthy runs only")
    p.add_argument("--breaks-only", action="store_true", help="broken runs only")
    p.add_argument("-j", type=int, default=min(2, os.cpu_count() or 1), help="runs at a time")
    p.add_argument("--json", type=Path, default=None,
                   help="append each result here as it comes (JSON lines); runs already there are not redone")
    p.add_argument("--from-json", type=Path, nargs="+", default=None, metavar="JSONL",
                   help="reprint the table from saved results; run nothing")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    # A child's roles (internal).
    p.add_argument("--prepare", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--one", nargs=5, metavar=("ENTRY", "SEED", "VARIANT", "MODEL", "DATA"), help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.prepare is not None or a.one is not None:
        out = prepare(a.prepare) if a.prepare is not None else run_one(
            a.one[0], int(a.one[1]), a.one[2], a.one[3], a.one[4])
        a.result.write_text(json.dumps(out))
        return 0
    if a.from_json is not None:
        missing = [str(f) for f in a.from_json if not f.is_file()]
        if missing:
            print(f"error: no such results file: {', '.join(missing)}", file=sys.stderr)
            return 2
        unique: dict[tuple[Any, ...], dict[str, Any]] = {}
        for f in a.from_json:  # a run saved in two files counts once
            for r in _read_results(f):
                unique.setdefault((r["capability"], r["entry"], r["seed"], r["variant"]), r)
        saved = list(unique.values())
        lines, ok = table(saved)
        print("\n".join(lines))
        print(f"\n{len(saved)} saved runs; "
              f"{'every healthy run passes and every broken run fails' if ok else 'MISCLASSIFIED RUNS (!!)'}")
        return 0 if ok else 1
    if a.j < 1:
        print("error: -j must be >= 1", file=sys.stderr)
        return 2
    caps = []
    native = native_capability()
    for cap in a.capability:
        if supported(cap, native):
            caps.append(cap)
        else:
            print(f"capability {cap}: this CPU offers up to {native}; skipped", flush=True)
    if not caps:
        print("error: none of the capabilities asked for runs here", file=sys.stderr)
        return 2
    start = time.monotonic()
    done = _read_results(a.json) if a.json is not None and a.json.is_file() else []
    key = lambda r: (r["capability"], r["entry"], r["seed"], r["variant"])  # noqa: E731
    have = {key(r) for r in done}
    # Healthy runs first, then the breaks seed by seed: a table cut short still covers every break.
    jobs = [] if a.breaks_only else [Job(capability=cap, entry=e, seed=s, variant="healthy")
                                     for cap in caps for e in a.entry for s in a.seeds]
    jobs += [] if a.no_breaks else [Job(capability=cap, entry=e, seed=s, variant=v) for s in a.seeds
                                    for cap in caps for e in a.entry for v in BREAKS[e]]
    wanted = {(j.capability, j.entry, j.seed, j.variant) for j in jobs}
    jobs = [j for j in jobs if (j.capability, j.entry, j.seed, j.variant) not in have]
    if done:
        print(f"{len(have & wanted)} runs already in {a.json}; {len(jobs)} to go", flush=True)
    results: list[dict[str, Any]] = [r for r in done if key(r) in wanted]
    with tempfile.TemporaryDirectory(prefix="slime-learning-") as tmp:
        assets = {cap: _child(["--prepare", str(Path(tmp) / cap)], cap, a.timeout)
                  for cap in sorted({j.capability for j in jobs})}

        def do(job: Job) -> dict[str, Any]:
            got = _child(["--one", job.entry, str(job.seed), job.variant, assets[job.capability]["model"],
                          assets[job.capability]["data"]], job.capability, a.timeout)
            got["capability"] = job.capability
            if a.json is not None:
                with a.json.open("a") as fh:  # one line per run: an interrupted table resumes
                    fh.write(json.dumps(got) + "\n")
            print(f"  {job.entry} {job.capability} seed {job.seed} {job.variant}: "
                  + ", ".join(f"{k} {v:+.4f}" for k, v in got["values"].items()), flush=True)
            return got

        with ThreadPoolExecutor(max_workers=a.j) as pool:
            results += list(pool.map(do, jobs))
    lines, ok = table(results)
    print("\n".join(lines))
    print(f"\n{len(results)} runs ({len(jobs)} run now, in {time.monotonic() - start:.0f} s); capabilities "
          f"{', '.join(caps)}; "
          f"{'every healthy run passes and every broken run fails' if ok else 'MISCLASSIFIED RUNS (!!)'}")
    return 0 if ok else 1


def _read_results(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    sys.exit(main())
