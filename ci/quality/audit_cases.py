"""The leak audit's cases: known failures replayed against selection by executed code.

Two kinds. Every planted break under tests/e2e/plants/: its patch is the diff and the
entries its `only:` names are the ones that catch it. And every commit of main that a
bisect blamed for an entry's failure (the history's `bisects`, a first-bad or rate-rose
answer): the commit's diff against its first parent, and the entry that failed. For each,
the selection (`ci.select.by_execution`) must pick one of those entries; a CPU suite always
runs every entry. `python -m ci select-audit` (ci/quality/select_audit.py) reports them;
its `--issues` keeps an issue per missed entry (ci/quality/leak_issues.py).
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ci.durations import DURATIONS_FILE, DurationStore
from ci.durations import baseline as baseline_durations
from ci.errors import StoreError, UsageError
from ci.quality.plants import Plant
from ci.quality.plants import apply as apply_patch
from ci.quality.plants import discover as discover_plants
from ci.registry.loader import Registry
from ci.select import executed
from ci.select.blocks import git_line_map
from ci.select.by_execution import Change, changes, pick
from ci.select.discover import discover
from ci.select.entries import ResolvedEntry, resolve, select_only
from ci.select.job_entries import commit_changes, commit_known
from ci.select.unified_diff import file_diff, parse_diff

if TYPE_CHECKING:
    from ci.history.bisects import BisectRow

PLANT, BLAMED = "plant", "blamed commit"
BLAMING = ("first-bad", "rate-rose")  # the bisect answers that name a commit as the cause


@dataclass(frozen=True, kw_only=True)
class Case:
    """One known failure (a plant, a blamed commit) replayed against the selection."""

    plant: str  # the plant's key, or "<short sha> <entry>" for a blamed commit
    suite: str
    catchers: tuple[str, ...]  # the entries its `only:` names, or the entry that failed
    selected: bool
    why: str  # the reason of the first catcher picked, or of the first one missed
    picked: int  # entries of its suite the selection runs
    total: int
    gpu_seconds: float  # of the entries picked (GPU suites)
    gpu_seconds_all: float
    kind: str = PLANT  # PLANT or BLAMED


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

    return _case(root, plant.key, PLANT, registry, suite.name, entries, catchers,
                 functools.partial(plant_changes, root, plant.patch), records, durations)


def plant_changes(root: Path, patch: Path) -> tuple[Change, ...]:
    """A plant's change as it lands on this checkout. Its hunks carry the line numbers of the
    tree it was made on, and `git apply` moves a hunk to where its context is now: so the
    patch is applied to a scratch copy of the files it names and each is diffed against the
    checkout's, both sides read (the blocks of `ci.select.blocks` need today's lines). A
    patch that does not apply here is read by its own numbers and by functions alone, its
    stale lines never narrowed to a block (the plants' own test fails such a plant)."""
    files = parse_diff(patch.read_text(encoding="utf-8"))
    read_old = _read(root)
    with tempfile.TemporaryDirectory(prefix="slime-ci-plant-") as tmp:
        tree = Path(tmp)
        for f in files:
            if f.old_path is not None and (root / f.old_path).is_file():
                (tree / f.old_path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(root / f.old_path, tree / f.old_path)
        if apply_patch(patch, tree) is not None:
            return tuple(replace(c, regions=None) for c in changes(files, read_old, lambda _: None))
        read_new = _read(tree)
        landed = [file_diff(f.old_path, f.new_path, read_old(f.old_path) or "" if f.old_path else "",
                            read_new(f.new_path) or "" if f.new_path else "") for f in files]
        return changes(landed, read_old, read_new)


def replay_blamed(root: Path, registry: Registry, answers: Sequence[BisectRow],
                  records: Mapping[str, executed.Record], durations: Mapping[str, float],
                  note: Callable[[str], None]) -> list[Case]:
    """What the selection would have run for each commit a bisect blamed (once per commit and
    entry); one that cannot be replayed here is `note`d and left out."""
    out: list[Case] = []
    seen: set[tuple[str, str]] = set()
    for a in answers:
        if a.kind not in BLAMING or not a.commit or (a.commit, a.entry_id) in seen:
            continue
        seen.add((a.commit, a.entry_id))
        name = f"{a.commit[:10]} {a.entry_id}"
        suite = registry.get(a.suite)
        entries = resolve(suite, discover(root), registry=registry.name) if suite is not None else []
        if a.entry_id not in {e.id for e in entries}:
            note(f"left out blamed commit {name}: the entry is no longer in suite {a.suite!r}")
            continue
        if not commit_known(root, a.commit):
            note(f"left out blamed commit {name}: this checkout lacks it or its parent "
                 "(a shallow clone? `git fetch --unshallow`)")
            continue
        out.append(_case(root, name, BLAMED, registry, a.suite, entries, (a.entry_id,),
                         functools.partial(commit_changes, root, a.commit), records, durations))
    return out


def _case(root: Path, name: str, kind: str, registry: Registry, suite_name: str,
          entries: Sequence[ResolvedEntry],
          catchers: tuple[str, ...], diff: Callable[[], tuple[Change, ...]],
          records: Mapping[str, executed.Record], durations: Mapping[str, float]) -> Case:
    suite = registry[suite_name]
    if not suite.needs_gpus:
        return Case(plant=name, kind=kind, suite=suite.name, catchers=catchers, selected=True,
                    why="a CPU suite runs every entry", picked=len(entries), total=len(entries),
                    gpu_seconds=0.0, gpu_seconds_all=0.0)
    picks = {p.entry: p for p in pick([(e.id, e.path) for e in entries], diff(), records, registry.selection,
                                      line_map=git_line_map(root))}
    hit = [picks[c] for c in catchers if picks[c].runs]
    shown = hit[0] if hit else picks[catchers[0]]

    def cost(e: ResolvedEntry) -> float:
        return durations.get(e.id, 0.0) * e.num_gpus

    return Case(plant=name, kind=kind, suite=suite.name, catchers=catchers, selected=bool(hit),
                why=shown.reason, picked=sum(p.runs for p in picks.values()), total=len(entries),
                gpu_seconds=sum(cost(e) for e in entries if picks[e.id].runs),
                gpu_seconds_all=sum(cost(e) for e in entries))


def recall(cases: Sequence[Case]) -> float:
    """The share of the cases whose catcher the selection runs (1.0 with no cases)."""
    return sum(c.selected for c in cases) / len(cases) if cases else 1.0


@dataclass(frozen=True, kw_only=True)
class Audit:
    """Every case replayed, and how many GPU entries of their suites had no record."""

    cases: tuple[Case, ...]
    unrecorded: int
    entries: int
    recorded_at: float  # the newest record's time: when what the selection reads last changed

    def missed(self) -> tuple[Case, ...]:
        return tuple(c for c in self.cases if not c.selected)


def bisect_answers(url: str | None, warn: Callable[[str], None]) -> list[BisectRow]:
    """The store's bisect answers; none without a store, and a store that cannot be read is
    one warning (the plants are replayed still)."""
    from ci.history.bisects import bisects
    from ci.history.store import open_store

    if url is None or (url.startswith("sqlite:///") and not Path(url.split(":///", 1)[1]).is_file()):
        return []
    try:
        with open_store(url, create=False) as store:
            return bisects(store)
    except StoreError as exc:
        warn(f"history: its bisect answers are unavailable ({exc}); replaying the plants alone")
        return []


def run_audit(root: Path, registry: Registry, url: str | None, warn: Callable[[str], None], *,
              records_file: Path | None = None) -> Audit:
    """Replay every plant and every blamed commit against the records (`records_file` alone,
    else the store's newest trusted record per entry over the checkout's records file)."""
    plants = discover_plants(root)
    if not plants:
        raise UsageError(f"no plants under {root / 'tests/e2e/plants'}: nothing to replay")
    if records_file is not None:
        records = executed.load(records_file)
    else:
        from ci.history.record import executed_records

        records = executed_records(url, root, warn=warn)
    durations = {**baseline_durations(root), **DurationStore(root / DURATIONS_FILE).load()}
    cases = [replay(root, registry, p, records, durations) for p in plants]
    cases += replay_blamed(root, registry, bisect_answers(url, warn), records, durations, warn)
    gpu = {e for name in {c.suite for c in cases if registry[c.suite].needs_gpus}
           for e in _suite_ids(root, registry, name)}
    return Audit(cases=tuple(cases), unrecorded=len(gpu - set(records)), entries=len(gpu),
                 recorded_at=max((r.recorded_at for r in records.values()), default=0.0))


def _suite_ids(root: Path, registry: Registry, name: str) -> list[str]:
    suite = registry[name]
    return [e.id for e in resolve(suite, discover(root), registry=registry.name)]
