"""`python -m ci select-audit`: would selection by executed code have run the entry that caught each break?

Every planted break under tests/e2e/plants/ is a known failure: its patch is the diff and
the entries its `only:` names are the ones that catch it. For each, the selection
(`ci.select.by_execution`, on the history's newest trusted records, then the
checkout's records file) must pick at least one of them; a
CPU suite always runs every entry. The table gives each plant's verdict and the entries
selected of its suite, then the recall and the GPU-seconds selected against all entries
of the suites (measured durations, else the committed baseline). Exit 1 below the
registry's recall (`SelectionPolicy.recall`, default 1.0).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.args import existing_dir
from ci.durations import DURATIONS_FILE, DurationStore
from ci.durations import baseline as baseline_durations
from ci.errors import EXIT_FAILED, EXIT_OK, UsageError
from ci.quality.plants import Plant
from ci.quality.plants import discover as discover_plants
from ci.registry.loader import Registry, load_registry
from ci.select import executed
from ci.select.by_execution import changes, parse_diff, pick
from ci.select.discover import discover
from ci.select.entries import ResolvedEntry, resolve, select_only


@dataclass(frozen=True, kw_only=True)
class Case:
    """One plant replayed against the selection."""

    plant: str
    suite: str
    catchers: tuple[str, ...]  # the entries its `only:` names
    selected: bool
    why: str  # the reason of the first catcher picked, or of the first one missed
    picked: int  # entries of its suite the selection runs
    total: int
    gpu_seconds: float  # of the entries picked (GPU suites)
    gpu_seconds_all: float


def _read(root: Path) -> Callable[[str], str | None]:
    def read(path: str) -> str | None:
        try:
            return (root / path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
    return read


def replay(root: Path, registry: Registry, plant: Plant, records: Mapping[str, executed.Record],
           durations: Mapping[str, float]) -> Case:
    """What the selection would have run for one plant's patch."""
    suite = registry.get(plant.suite)
    if suite is None:
        raise UsageError(f"{plant.patch}: suite {plant.suite!r} is not in the registry; fix its header")
    entries: list[ResolvedEntry] = resolve(suite, discover(root), registry=registry.name)
    catchers = tuple(e.id for e in select_only(entries, plant.only))
    if not suite.needs_gpus:
        return Case(plant=plant.key, suite=suite.name, catchers=catchers, selected=True,
                    why="a CPU suite runs every entry", picked=len(entries), total=len(entries),
                    gpu_seconds=0.0, gpu_seconds_all=0.0)
    diff = changes(parse_diff(plant.patch.read_text(encoding="utf-8")), _read(root), lambda _: None)
    picks = {p.entry: p for p in pick([(e.id, e.path) for e in entries], diff, records, registry.selection)}
    hit = [picks[c] for c in catchers if picks[c].runs]
    shown = hit[0] if hit else picks[catchers[0]]

    def cost(e: ResolvedEntry) -> float:
        return durations.get(e.id, 0.0) * e.num_gpus

    return Case(plant=plant.key, suite=suite.name, catchers=catchers, selected=bool(hit),
                why=shown.reason, picked=sum(p.runs for p in picks.values()), total=len(entries),
                gpu_seconds=sum(cost(e) for e in entries if picks[e.id].runs),
                gpu_seconds_all=sum(cost(e) for e in entries))


def report(cases: Sequence[Case], recall_goal: float, unrecorded: int, entries: int) -> tuple[str, bool]:
    """The table and closing lines; whether the recall reaches the goal."""
    rows = [("plant", "suite", "selected", "entries", "reason")]
    rows += [(c.plant, c.suite, "yes" if c.selected else "MISSED", f"{c.picked} of {c.total}", c.why)
             for c in cases]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows]
    caught = sum(c.selected for c in cases)
    recall = caught / len(cases) if cases else 1.0
    picked, total = sum(c.gpu_seconds for c in cases), sum(c.gpu_seconds_all for c in cases)
    ratio = f"{picked / total:.2f}" if total else "n/a"
    lines += ["", f"recall {recall:.2f} ({caught} of {len(cases)} plants; "
                  f"the registry asks {recall_goal:.2f})",
              f"GPU-seconds selected / all entries of their suites: {picked:.0f} / {total:.0f} = {ratio}"]
    if unrecorded:
        lines.append(f"{unrecorded} of {entries} GPU entries have no record and always run: record "
                     "them with `python -m ci run --suite <suite> --record-executed`")
    return "\n".join(lines), recall >= recall_goal


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ci select-audit",
                                description="replay every planted break against selection by executed "
                                            "code; exit 1 below the registry's recall")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: here)")
    p.add_argument("--records", type=Path, default=None,
                   help=f"read the records from this file alone (default: the history's newest "
                        f"trusted record per entry, then <root>/{executed.RECORDS_FILE})")
    p.add_argument("--history", metavar="URL", default=None,
                   help="the run-history store to read records from (default: SLIME_CI_HISTORY_URL, "
                        "else the checkout's store; `off`: the records file alone)")
    return p


def main(argv: Sequence[str]) -> int:
    """Replay, print the table, exit by the recall."""
    args = build_parser().parse_args(list(argv))
    root = existing_dir("--root", args.root)
    registry = load_registry(root)
    plants = discover_plants(root)
    if not plants:
        raise UsageError(f"no plants under {root / 'tests/e2e/plants'}: nothing to replay")
    if args.records is not None:
        records = executed.load(args.records)
    else:
        from ci.history.record import executed_records
        from ci.history.store import resolve_url

        records = executed_records(resolve_url(args.history, os.environ, root), root,
                                   warn=lambda m: print(f"warning: {m}", file=sys.stderr))
    durations = {**baseline_durations(root), **DurationStore(root / DURATIONS_FILE).load()}
    cases = [replay(root, registry, p, records, durations) for p in plants]
    gpu = {e for name in {c.suite for c in cases if registry[c.suite].needs_gpus}
           for e in _suite_ids(root, registry, name)}
    text, ok = report(cases, registry.selection.recall, len(gpu - set(records)), len(gpu))
    print(text)
    return EXIT_OK if ok else EXIT_FAILED


def _suite_ids(root: Path, registry: Registry, name: str) -> list[str]:
    suite = registry[name]
    return [e.id for e in resolve(suite, discover(root), registry=registry.name)]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
