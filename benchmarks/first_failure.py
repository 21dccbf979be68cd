"""Time to the first failing file: today's order (longest first) vs failure-first, side by side.

For each planted break in slime/ (a real one-line bug, committed on its own branch of a
scratch clone), cpu_unit runs twice from the same start: with `--order longest` (today)
and with `--order failure-first` (what failed on the branch before, then the test files
the branch's diff changes or affects, nearest in the import graph first and equally near
ones shortest first, then the rest longest first). Each run is watched live; the
seconds from its start to its first FAILED line are taken and the run is interrupted
(SIGINT, as Ctrl-C) so the benchmark pays only until the first failure.

Both sides plan with the same measured durations: one full run of cpu_unit on the
unbroken checkout first (or `--durations FILE` from an earlier run).

    python benchmarks/first_failure.py [--durations FILE] [-j N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_FAIL = re.compile(r"^\[\s*\d+/\d+\] (FAILED|EMPTY|TIMEOUT)\s+(\S+)")

# (what breaks, file, the line as it is, the line broken): real bugs a change could make.
BREAKS: tuple[tuple[str, str, str, str], ...] = (
    ("k2 KL estimate doubled", "slime/utils/ppo_utils.py",
     "return log_ratio.square() / 2", "return log_ratio.square()"),
    ("PPO ratio inverted", "slime/utils/ppo_utils.py",
     "ratio = torch.exp(-ppo_kl)", "ratio = torch.exp(ppo_kl)"),
    ("F1 loses its factor 2", "slime/rollout/rm_hub/f1.py",
     "return 2 * precision * recall / (precision + recall)",
     "return precision * recall / (precision + recall)"),
    ("dynamic filter keeps flat groups", "slime/rollout/filter.py",
     "return max(rewards) > min(rewards)", "return max(rewards) >= min(rewards)"),
    ("\\boxed{} content off by one", "slime/rollout/rm_hub/math_utils.py",
     "text[i + 1 : close].strip()", "text[i : close].strip()"),
)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True)


def ci_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "ci", "run", "--suite", "cpu_unit", *args]


def _cause(lines: Iterator[str]) -> str:
    """The first `E ` line of the failed file's output tail (the runner prints it next), so a
    reader can tell a failure the break caused from one the machine's load did."""
    for n, line in enumerate(lines):
        if line.startswith("E ") and line[1:].strip():
            return line[1:].strip()[:90]
        if line.startswith("error: ") or n > 400:
            return line.strip()[:90]
    return "?"


def first_failure(clone: Path, argv: list[str], limit: float) -> tuple[float | None, str]:
    """Seconds from start to the first failing file (and its name); the run is then interrupted."""
    env = {**os.environ, "PYTHONPATH": str(clone)}
    env.pop("GITHUB_ACTIONS", None)
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    found: tuple[float | None, str] = (None, "")
    assert proc.stdout is not None
    for line in proc.stdout:
        match = FIRST_FAIL.match(line)
        if match:
            found = (time.monotonic() - start, f"{match.group(2)}: {_cause(proc.stdout)}")
            break
        if time.monotonic() - start > limit:
            break
    proc.send_signal(signal.SIGINT)  # the run ends its entries' process groups itself
    try:
        proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group we started, and only it
        proc.communicate()
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--durations", type=Path, help="measured durations to plan with (default: "
                        "measure them with one full run of the unbroken checkout)")
    parser.add_argument("-j", "--jobs", type=int, help="the runner's -j")
    parser.add_argument("--limit", type=float, default=900, help="seconds a side may take (default 900)")
    parser.add_argument("--breaks", help="which breaks to plant, by number, e.g. 1,3 (default: all)")
    args = parser.parse_args()
    jobs = ["-j", str(args.jobs)] if args.jobs else []
    try:
        chosen = {int(x) for x in args.breaks.split(",")} if args.breaks else set(range(1, len(BREAKS) + 1))
    except ValueError:
        parser.error(f"--breaks {args.breaks!r}: expected numbers like 1,3")
    if not chosen <= set(range(1, len(BREAKS) + 1)):
        parser.error(f"--breaks: there are {len(BREAKS)} breaks, numbered from 1")
    print(f"{len(chosen)} planted breaks; {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="first-failure-") as tmp:
        clone = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
        git(clone, "checkout", "-q", "-B", "base", "HEAD")
        for cfg in ("user.email=bench@example.invalid", "user.name=bench"):
            git(clone, "config", *cfg.split("="))
        durations = Path(tmp) / "durations.json"
        if args.durations:
            shutil.copy(args.durations, durations)
        else:
            start = time.monotonic()
            subprocess.run(ci_argv("--durations", str(durations), "--history", "off", "--order", "longest",
                                   *jobs), cwd=clone, env={**os.environ, "PYTHONPATH": str(clone)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            print(f"  durations measured by one full run: {time.monotonic() - start:.0f}s, "
                  f"{len(json.loads(durations.read_text()))} files")
        rows = []
        for n, (what, path, old, new) in enumerate(BREAKS, 1):
            if n not in chosen:
                continue
            git(clone, "checkout", "-q", "-B", f"break-{n}", "base")
            target = clone / path
            text = target.read_text(encoding="utf-8")
            assert text.count(old) == 1, f"{path}: the line to break is not there once: {old}"
            target.write_text(text.replace(old, new), encoding="utf-8")
            git(clone, "commit", "-qam", f"plant: {what}")
            sides = []
            for order, history in (("longest", "off"), ("failure-first", f"sqlite:///{tmp}/h{n}.sqlite")):
                plan = Path(tmp) / f"d-{n}-{order}.json"
                shutil.copy(durations, plan)  # both sides plan with the same numbers
                sides.append(first_failure(clone, ci_argv(
                    "--durations", str(plan), "--history", history, "--order", order, "--base", "base",
                    *jobs), args.limit))
            (today, f_today), (ours, f_ours) = sides
            rows.append((what, today, ours))
            shown = lambda s: "none" if s is None else f"{s:6.1f}s"  # noqa: E731
            ratio = f"{ours / today:.2f}" if today and ours else "-"
            print(f"  {what:<34} today {shown(today)}  failure-first {shown(ours)}  ratio {ratio}\n"
                  f"      today's first: {f_today or '-'}\n      failure-first's: {f_ours or '-'}")
        git(clone, "checkout", "-q", "base")
    pairs = [(t, o) for _, t, o in rows if t and o]
    if pairs:
        total = sum(o for _, o in pairs) / sum(t for t, _ in pairs)
        geo = statistics.geometric_mean([o / t for t, o in pairs])
        print(f"failure-first / today: {total:.2f} of the summed time to first failure, "
              f"geometric mean of ratios {geo:.2f} (goal <= 0.25); load now {os.getloadavg()[0]:.2f}")
    missed = [w for w, t, o in rows if not (t and o)]
    if missed:
        print(f"no failure seen for: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
