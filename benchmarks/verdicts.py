"""How right are the verdicts? A long synthetic history with known causes, judged PR by PR.

A suite of 200 GPU entries runs on `main` (one run per merged commit, one retry, as the GPU
suites run) and on pull requests branched from it. Every failure is planted, so its cause is
known: breaks that land on main and are fixed some runs later, breaks a PR makes, flaky
entries at 5 %, 15 % and 30 %, lost nodes, OOM kills, images that could not be pulled,
attempts that never got their GPUs, and entries a PR adds that fail. Each PR run is then
judged by `ci.history.verdicts.judge` against the trusted history as it stood when the run
ended (its merge base given), and every verdict is compared with the planted cause:
precision and recall per verdict (goal: at least 0.95 each).

Then the time to build the comment for the 200-entry suite: the verdicts and the Markdown of
one PR run, from rows in memory and from a real SQLite store holding the whole history.

    python benchmarks/verdicts.py [--entries 200] [--main-runs 400] [--prs 400] [--seed 7]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci.github.check_runs import build as build_checks  # noqa: E402
from ci.github.pr_verdicts import markdown, table_row  # noqa: E402
from ci.history.rows import AttemptRecord, RunRecord  # noqa: E402
from ci.history.store import AttemptRow, open_store  # noqa: E402
from ci.history.verdicts import KINDS, Base, SuiteRules, blocking, judge  # noqa: E402
from ci.registry.model import Entry, Suite  # noqa: E402

SUITE = "megatron"
CPU_SUITE = "cpu_unit"  # a CPU suite beside it: its own entries, runs and PRs' runs, no GPU infrastructure
RULES = {SUITE: SuiteRules(flaky_rate=0.1, min_runs=10), CPU_SUITE: SuiteRules(flaky_rate=0.1, min_runs=10)}
# Where each suite runs (`runs.backend`): docker's own exit 125 counts only under Docker.
BACKEND = {SUITE: "docker slimerl/slime:latest", CPU_SUITE: "local"}
HARDWARE = {SUITE: "cuda", CPU_SUITE: "cpu"}
WINDOW = 400  # trusted runs read as the baseline, as `python -m ci why` reads them
FLAKY_RATES = (0.05, 0.15, 0.30)
INFRA = {  # cause -> (probability per attempt, outcome, reason, exit code)
    "lost": (0.002, "lost", "node gpu-{n} lost mid-entry", None),
    "oom": (0.001, "failed", "[812.3] Out of memory: Killed process 4{n} (python)", -9),
    "pull": (0.0005, "failed", "docker: Error response from daemon: pull access denied for slimerl/x", 125),
    "gpu-wait": (0.0005, "timeout", "timed out after 1800s waiting for 8 GPU(s): GPUs 0-7 held by pid {n}", 124),
}
CPU_INFRA = ("oom",)  # a CPU job has no GPU node, image or GPU wait: only the OOM killer


@dataclass
class World:
    rng: random.Random
    entries: list[str]
    suite: str
    flaky: dict[str, float]
    main_breaks: list[tuple[str, int, int]] = field(default_factory=list)  # entry, first bad run, fixed at

    def broken_on_main(self, entry: str, run: int) -> bool:
        return any(e == entry and start <= run < end for e, start, end in self.main_breaks)


def attempt(world: World, entry: str, *, broken: bool, n: int) -> tuple[str, str, int | None, str]:
    """One attempt: (outcome, reason, exit code, planted cause)."""
    for cause, (p, outcome, reason, code) in INFRA.items():
        if world.suite == CPU_SUITE and cause not in CPU_INFRA:
            continue
        if world.rng.random() < p:
            return outcome, reason.format(n=world.rng.randrange(100)), code, "infrastructure"
    if broken:
        return "failed", "AssertionError: loss diverged at step 3", 1, "broken"
    if world.rng.random() < world.flaky.get(entry, 0.0):
        return "failed", "TimeoutError: rollout stalled", 1, "flaky"
    return "passed", "", 0, ""


def run_entry(world: World, entry: str, *, broken: bool, n: int) -> tuple[list[AttemptRecord], str]:
    """An entry as the runner runs it: a failure is retried once (a lost node always)."""
    tries: list[AttemptRecord] = []
    causes: list[str] = []
    for k in (1, 2, 3):
        outcome, reason, code, cause = attempt(world, entry, broken=broken, n=n)
        causes.append(cause)
        lost = sum(t.outcome == "lost" for t in tries)
        tries.append(AttemptRecord(entry_id=entry, path=entry, attempt=k, final=False, outcome=outcome,
                                   reason=reason, exit_code=code, num_gpus=8 if world.suite == SUITE else 0,
                                   seconds=60.0, node="gpu-1"))
        if outcome == "passed" or k > 1 + lost or (k == 2 and outcome != "lost" and lost == 0):
            break
    last = tries[-1]
    final_outcome = last.outcome
    if last.outcome == "passed" and len(tries) > 1:
        final_outcome = "flaky"
    tries[-1] = AttemptRecord(**{**last.__dict__, "final": True, "outcome": final_outcome})
    failed = [c for c in causes if c]
    truth = ""
    if final_outcome not in ("passed",):
        # The cause of what the verdict must explain: the final failure, or (passed on a retry)
        # the failures before it.
        truth = causes[-1] if final_outcome != "flaky" else ("infrastructure" if all(
            c == "infrastructure" for c in failed) else "flaky")
    return tries, truth


def as_rows(run: RunRecord) -> list[AttemptRow]:
    return [AttemptRow(run_uid=run.uid, suite=run.suite, commit=run.commit, branch=run.branch, event=run.event,
                       hardware=run.hardware, started_at=run.started_at, entry_id=a.entry_id, path=a.path,
                       attempt=a.attempt, final=a.final, outcome=a.outcome, seconds=a.seconds, reason=a.reason,
                       num_gpus=a.num_gpus, trusted=run.trusted, pr=run.pr, exit_code=a.exit_code, node=a.node,
                       backend=run.backend)
            for a in run.attempts]


def _world(rng: random.Random, suite: str, count: int, main_runs: int) -> World:
    folder = "tests/e2e/megatron" if suite == SUITE else "tests/unit"
    entries = [f"{folder}/test_{i:03d}.py" for i in range(count)]
    flaky = {e: FLAKY_RATES[i % 3] for i, e in enumerate(rng.sample(entries, count // 10))}
    world = World(rng=rng, entries=entries, suite=suite, flaky=flaky)
    stable = [e for e in entries if e not in flaky]
    for _ in range(main_runs // 25):  # a break lands on main every ~25 runs, fixed 2..15 runs later
        start = rng.randrange(20, main_runs)
        world.main_breaks.append((rng.choice(stable), start, start + rng.randint(2, 15)))
    return world


def build(args: argparse.Namespace) -> tuple[list[World], list[RunRecord],
                                             list[tuple[RunRecord, str, dict[str, str]]]]:
    """main's runs of both suites (megatron, cpu_unit: one run each per merged commit) and PR runs."""
    rng = random.Random(args.seed)
    worlds = [_world(rng, SUITE, args.entries, args.main_runs), _world(rng, CPU_SUITE, args.cpu_entries,
                                                                       args.main_runs)]
    main_runs: list[RunRecord] = []
    prs: list[tuple[RunRecord, str, dict[str, str]]] = []
    at = 1_700_000_000.0
    pr_every = max(1, args.main_runs // args.prs) if args.prs else 0
    number = 0
    for n in range(args.main_runs):
        at += 3600
        commit = f"{n:06d}" + "m" * 34
        for k, world in enumerate(worlds):
            tries: list[AttemptRecord] = []
            for e in world.entries:
                got, _ = run_entry(world, e, broken=world.broken_on_main(e, n), n=n)
                tries += got
            main_runs.append(RunRecord(uid=f"main-{n}-{world.suite}", suite=world.suite, commit=commit,
                                       branch="main", event="push", hardware=HARDWARE[world.suite],
                                       backend=BACKEND[world.suite], started_at=at + k, ended_at=at + 600,
                                       exit_code=0, attempts=tuple(tries)))
        if n < 30 or not pr_every or n % pr_every:
            continue
        # A PR branched a few runs back, run now: it breaks 0-2 entries, sometimes adds one.
        number += 1
        base = n - rng.randint(0, 3)
        for k, world in enumerate(worlds):
            entries = world.entries
            broke = set(rng.sample(entries, rng.choice((0, 1, 1, 2))))  # flaky ones too
            folder = entries[0].rsplit("/", 1)[0]
            added = f"{folder}/test_new_{number}.py" if rng.random() < 0.1 else None
            truth: dict[str, str] = {}
            tries = []
            for e in [*entries, *([added] if added else [])]:
                broken = e in broke or e == added or world.broken_on_main(e, base)
                got, cause = run_entry(world, e, broken=broken, n=n)
                tries += got
                if cause:
                    if cause == "broken":
                        # Failing on main at the base and in main's newest run: it fails anyway.
                        cause = ("unknown" if e == added else "already-failing" if world.broken_on_main(e, base)
                                 and world.broken_on_main(e, n) else "new")
                    truth[e] = cause
            run = RunRecord(uid=f"pr-{number}-{world.suite}", suite=world.suite,
                            commit=f"{number:06d}" + "p" * 34, branch=f"pr-{number}", event="pull_request",
                            hardware=HARDWARE[world.suite], backend=BACKEND[world.suite],
                            started_at=at + 700 + k, ended_at=at + 1300, exit_code=1, trusted=False, pr=number,
                            attempts=tuple(tries))
            prs.append((run, f"{base:06d}" + "m" * 34, truth))
    return worlds, main_runs, prs


def score(main_runs: list[RunRecord], prs: list[tuple[RunRecord, str, dict[str, str]]]) -> tuple[
        dict[str, tuple[int, int, int]], Counter[tuple[str, str]], float]:
    history = [r for run in main_runs for r in as_rows(run)]
    starts = [r.started_at for r in history]
    firsts: dict[str, float] = {}
    for run in main_runs:  # a commit's first run, of whichever suite
        firsts.setdefault(run.commit, run.started_at)
    per_run = sum(len(r.attempts) for r in main_runs if r.commit == main_runs[0].commit)  # every suite
    tp: Counter[str] = Counter()
    got_n: Counter[str] = Counter()
    want_n: Counter[str] = Counter()
    confusion: Counter[tuple[str, str]] = Counter()
    took = []
    for run, base, truth in prs:
        hi = bisect.bisect_left(starts, run.started_at)
        window = history[max(0, hi - WINDOW * per_run):hi]
        t0 = time.perf_counter()
        verdicts = judge(as_rows(run), window, base=Base(commit=base, at=firsts[base]), suites=RULES)
        took.append(time.perf_counter() - t0)
        got = {v.entry_id: v.kind for v in verdicts}
        rule = {v.entry_id: v.rule for v in verdicts}
        for e in set(got) | set(truth):
            g, w = got.get(e, "(none)"), truth.get(e, "(none)")
            confusion[(w, f"{g} (rule {rule.get(e, '-')})")] += 1
            got_n[g] += 1
            want_n[w] += 1
            tp[g] += g == w
    table = {k: (tp[k], got_n[k], want_n[k]) for k in KINDS}
    return table, confusion, statistics.median(took)


def comment_timing(main_runs: list[RunRecord], prs: list[tuple[RunRecord, str, dict[str, str]]],
                   repeat: int) -> tuple[float, float, int]:
    """Seconds to build the comment of one PR run of the suite: from memory; through SQLite."""
    run, base, truth = max((p for p in prs if p[0].suite == SUITE), key=lambda p: len(p[2]))
    main_runs = [m for m in main_runs if m.suite == SUITE]
    history = [r for m in main_runs[-WINDOW:] for r in as_rows(m)]
    suites = {SUITE: Suite(name=SUITE, tier="gpu", purpose="p", profile="e2e", label="run-ci-megatron",
                           entries=tuple(Entry(path=e.entry_id) for e in run.attempts if e.final))}

    def build_comment(judged: list[AttemptRow], rows: list[AttemptRow]) -> str:
        first = min((r.started_at for r in rows if r.commit == base), default=None)
        verdicts = judge(judged, rows, base=Base(commit=base, at=first), suites=RULES)
        return markdown(verdicts, blocking(verdicts, RULES), title="PR", note="", suites=suites, rules=RULES)

    memory = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        body = build_comment(as_rows(run), history)
        memory.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/history.sqlite"
        with open_store(url) as store:
            for m in main_runs[-WINDOW:]:
                store.record(m)
            store.record(run)
        # The command a maintainer runs, in a process of its own: start, read, judge, render.
        paths = ", ".join(f"Entry(path={e.entry_id!r})" for e in run.attempts if e.final)
        (Path(tmp) / "ci/registry").mkdir(parents=True)
        (Path(tmp) / "ci/registry/repo_suites.py").write_text(
            "from ci.registry import Entry, Suite\n"
            f"SUITES = (Suite(name={SUITE!r}, tier='gpu', purpose='p', profile='e2e', label='run-ci-x', "
            f"entries=({paths},)),)\n", encoding="utf-8")
        stored = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "ci", "why", "--pr", str(run.pr), "--base", base,
                                   "--history", url, "--root", tmp, "--json"], cwd=ROOT, capture_output=True,
                                  text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
            stored.append(time.perf_counter() - t0)
        assert len(json.loads(done.stdout)) == len(truth), "the command judged what was planted"
    return statistics.median(memory), statistics.median(stored), len(body)


def checks_timing(main_runs: list[RunRecord], prs: list[tuple[RunRecord, str, dict[str, str]]],
                  repeat: int, suite: str, every_entry: bool = False) -> tuple[float, int, int]:
    """Seconds to build the check run of one PR run of `suite` (every failed entry annotated, the
    summary table), from its verdicts; (median, annotations, summary characters). `every_entry`:
    the worst case, that run with every entry failed."""
    run, base, _ = max((p for p in prs if p[0].suite == suite), key=lambda p: len(p[2]))
    if every_entry:
        run = RunRecord(**{**run.__dict__, "attempts": tuple(
            AttemptRecord(**{**a.__dict__, "outcome": "failed", "reason": "AssertionError: planted"})
            for a in run.attempts if a.final)})
    history = [r for m in [m for m in main_runs if m.suite == suite][-WINDOW:] for r in as_rows(m)]
    first = min((r.started_at for r in history if r.commit == base), default=None)
    verdicts = judge(as_rows(run), history, base=Base(commit=base, at=first), suites=RULES)
    blocked = blocking(verdicts, RULES)
    took = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        rows = {v: table_row(v, v in blocked, None, repo="acme/slime") for v in verdicts}
        [made] = build_checks([suite], verdicts, blocked, rows=rows, locations={})
        took.append(time.perf_counter() - t0)
    return statistics.median(took), len(made.annotations), len(made.summary)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=200)
    p.add_argument("--cpu-entries", type=int, default=200, help=f"entries of the CPU suite ({CPU_SUITE})")
    p.add_argument("--main-runs", type=int, default=400)
    p.add_argument("--prs", type=int, default=400)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--repeat", type=int, default=5, help="timings: the median of this many")
    args = p.parse_args()
    t0 = time.perf_counter()
    worlds, main_runs, prs = build(args)
    attempts = sum(len(r.attempts) for r in main_runs) + sum(len(r.attempts) for r, _, _ in prs)
    print(f"history: {SUITE} ({args.entries} entries) and {CPU_SUITE} ({args.cpu_entries}), {len(main_runs)} "
          f"main runs, {len(prs)} PR runs, {attempts} attempts; "
          f"{sum(len(w.flaky) for w in worlds)} flaky entries ({', '.join(f'{r:.0%}' for r in FLAKY_RATES)}), "
          f"{sum(len(w.main_breaks) for w in worlds)} breaks on main; built in {time.perf_counter() - t0:.1f}s; "
          f"load {os.getloadavg()[0]:.1f}")
    for suite in (SUITE, CPU_SUITE):
        part, _, _ = score(main_runs, [p for p in prs if p[0].suite == suite])
        print(f"  {suite}: " + ", ".join(f"{k} {r}/{g} given right, {r}/{w} planted found"
                                        for k, (r, g, w) in part.items()))
    table, confusion, per_pr = score(main_runs, prs)
    print(f"\n{'verdict':<16} {'planted':>8} {'given':>6} {'right':>6} {'precision':>10} {'recall':>7}  goal >= 0.95")
    ok = True
    for kind, (right, given, planted) in table.items():
        precision = right / given if given else float("nan")
        recall = right / planted if planted else float("nan")
        good = given > 0 and planted > 0 and precision >= 0.95 and recall >= 0.95
        ok &= good
        print(f"{kind:<16} {planted:>8} {given:>6} {right:>6} {precision:>10.3f} {recall:>7.3f}  "
              f"{'ok' if good else 'BELOW GOAL'}")
    wrong = sorted(((n, w, g) for (w, g), n in confusion.items() if not g.startswith(w + " ")), reverse=True)
    if wrong:
        print("misjudged (planted -> given): " + ", ".join(f"{w} -> {g}: {n}" for n, w, g in wrong))
    memory, stored, size = comment_timing(main_runs, prs, args.repeat)
    print(f"\njudging one PR run against up to {WINDOW} runs x {args.entries} entries (median over PRs): "
          f"{per_pr * 1000:.0f} ms")
    print(f"the comment of a {args.entries}-entry suite ({size} characters), median of {args.repeat}: "
          f"{memory * 1000:.0f} ms from rows in memory; `python -m ci why --pr N` on a SQLite store of "
          f"{min(WINDOW, len(main_runs))} runs, start to end: {stored * 1000:.0f} ms")
    for suite, size in ((SUITE, args.entries), (CPU_SUITE, args.cpu_entries)):
        for worst in (False, True):
            checks, notes, chars = checks_timing(main_runs, prs, args.repeat, suite, every_entry=worst)
            which = "with every entry failed" if worst else "of its PR run with the most failures"
            print(f"the check run of {suite} ({size} entries) {which}: {notes} annotations, a summary of "
                  f"{chars} characters; built in {checks * 1000:.1f} ms from its verdicts "
                  f"(median of {args.repeat})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
