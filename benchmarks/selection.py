"""Benchmark selection by executed code: recall on the plants, GPU-seconds on real commits.

    python benchmarks/selection.py                  # the checkout's records, its last 100 slime/ commits
    python benchmarks/selection.py --records FILE --commits 50

For every planted break under tests/e2e/plants/ it replays the selection as `python -m ci
select-audit` does (the patch is the diff; one of the entries its `only:` names must be
picked). For each of the repository's last N commits that touch slime/ (fewer when there
are fewer; the output says how many), the commit's own diff against its first parent is
the pull request: every GPU suite's entries are picked by the rule in
`ci.select.by_execution`, twice from the same records: by the functions each entry ran, and
narrowed to the blocks of statements it entered (`ci.select.blocks`); the GPU-seconds of the picked entries (duration times GPUs,
from the measured durations over tests/durations.json) are set against those of all
entries. The goal: recall 1.0 on the plants, at most 0.4 of the GPU-seconds on the commits.
Entries without a record always run, so before a recording run the ratio is 1.0: the
output says how many entries have a record.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci.durations import DURATIONS_FILE, DurationStore  # noqa: E402
from ci.durations import baseline as baseline_durations  # noqa: E402
from ci.quality.audit_cases import replay  # noqa: E402
from ci.quality.plants import discover as discover_plants  # noqa: E402
from ci.registry.loader import load_registry  # noqa: E402
from ci.select import executed  # noqa: E402
from ci.select.blocks import git_line_map  # noqa: E402
from ci.select.by_execution import leak, pick  # noqa: E402
from ci.select.discover import discover  # noqa: E402
from ci.select.entries import resolve  # noqa: E402
from ci.select.job_entries import commit_changes  # noqa: E402

GOAL_RECALL, GOAL_RATIO = 1.0, 0.4


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, default=ROOT / executed.RECORDS_FILE)
    parser.add_argument("--commits", type=int, default=100)
    args = parser.parse_args()
    registry = load_registry(ROOT)
    records = executed.load(args.records)
    durations = {**baseline_durations(ROOT), **DurationStore(ROOT / DURATIONS_FILE).load()}
    files = discover(ROOT)
    gpu = [s for s in registry.suites if s.needs_gpus and not s.dynamic]
    entries = {s.name: resolve(s, files, registry=registry.name) for s in gpu}
    ids = {e.id for es in entries.values() for e in es}
    print(f"records: {len(ids & set(records))} of {len(ids)} GPU entries ({args.records})")

    print("\nplants")
    cases = [replay(ROOT, registry, p, records, durations) for p in discover_plants(ROOT)]
    for c in cases:
        print(f"  {c.plant:<55} {'yes' if c.selected else 'MISSED':<6} {c.picked:>2} of {c.total:<2} {c.why}")
    recall = sum(c.selected for c in cases) / len(cases) if cases else 1.0
    print(f"recall {recall:.2f} on {len(cases)} plants (goal {GOAL_RECALL:.1f})")

    shas = git("log", "--no-merges", "--format=%H", f"-n{args.commits}", "--", "slime/").stdout.split()
    shas = [s for s in shas if git("rev-parse", "--verify", "-q", f"{s}^").returncode == 0]
    print(f"\ncommits: the last {len(shas)} that touch slime/ (asked for {args.commits})")
    # The same records read two ways, side by side: by the functions an entry ran alone (as
    # records without lines are read), and narrowed to the blocks it entered.
    by_function = {e: replace(r, lines={}, blobs={}) for e, r in records.items()}
    line_map = git_line_map(ROOT)
    rules = {"functions": (by_function, None), "blocks": (records, line_map)}
    picked_s = dict.fromkeys(rules, 0.0)
    all_s = 0.0
    # The same figures over the commits that touch no leak path (those run every entry by rule).
    picked_code = dict.fromkeys(rules, 0.0)
    all_code = 0.0
    leaking = 0
    reasons: Counter[str] = Counter()
    print(f"  {'commit':<10} {'functions':>9} {'blocks':>9}  subject")
    for sha in shas:
        diff = commit_changes(ROOT, sha)
        leaks = any(leak(c.path, registry.selection) for c in diff)
        leaking += leaks
        chosen = dict.fromkeys(rules, 0)
        total = 0
        for suite in gpu:
            es = entries[suite.name]
            pairs = [(e.id, e.path) for e in es]
            for e in es:
                all_s += durations.get(e.id, 0.0) * e.num_gpus
                all_code += 0.0 if leaks else durations.get(e.id, 0.0) * e.num_gpus
                total += 1
            for rule, (recs, lines) in rules.items():
                for p, e in zip(pick(pairs, diff, recs, registry.selection, line_map=lines), es, strict=True):
                    if p.runs:
                        picked_s[rule] += durations.get(e.id, 0.0) * e.num_gpus
                        picked_code[rule] += 0.0 if leaks else durations.get(e.id, 0.0) * e.num_gpus
                        chosen[rule] += 1
                        if rule == "blocks":
                            kind = p.reason if p.reason.startswith(("leak", "no record")) else p.reason.split(" ")[0]
                            reasons[kind] += 1
        subject = git("log", "-1", "--format=%s", sha).stdout.strip()[:60]
        print(f"  {sha[:10]} {chosen['functions']:>4} of {total:<2} {chosen['blocks']:>4} of {total:<2}  {subject}")
    for rule in rules:
        ratio = picked_s[rule] / all_s if all_s else float("nan")
        print(f"GPU-seconds selected / all, by {rule}: {picked_s[rule]:.0f} / {all_s:.0f} = {ratio:.2f} "
              f"(goal <= {GOAL_RATIO})")
    for rule in rules:
        ratio = picked_code[rule] / all_code if all_code else float("nan")
        print(f"  over the {len(shas) - leaking} commits that touch no leak path, by {rule}: {ratio:.2f}")
    print("reasons an entry ran (blocks): " + ", ".join(f"{k} {n}" for k, n in reasons.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
