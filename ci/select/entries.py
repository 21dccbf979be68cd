"""Which entries a suite selects, resolved, in which order, on which shard. Pure functions."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import PurePosixPath

from ci.errors import NothingRegistered, UsageError
from ci.registry.loader import REGISTRY
from ci.registry.model import Entry, Isolation, Smoke, Suite
from ci.select.discover import Kind, TestFile


@dataclass(frozen=True, kw_only=True)
class ResolvedEntry:
    """An entry ready to run: its file's GPU count and kind resolved."""

    id: str
    path: str
    test_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    timeout: float
    num_gpus: int
    kind: Kind
    why: str = ""  # why the plan selected it (shown by `changed`)
    cores: int = 1  # job slots it takes while it runs (files running their own process groups)
    prefork: bool = True  # False: the registry wants a fresh interpreter for this entry
    container: Isolation = "minimal"  # the entry's Docker privileges (ci/backends/docker_argv.py)


def _under(path: str, directory: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(directory))


def rule_files(suite: Suite, files: Mapping[str, TestFile]) -> list[str]:
    """Test files a rule-based suite takes: NUM_GPUS = 0 files under `include`, not under `exclude`."""
    if not suite.include:
        return []
    return sorted(
        path
        for path, tf in files.items()
        if tf.num_gpus == 0
        and any(_under(path, d) for d in suite.include)
        and not any(_under(path, d) for d in suite.exclude)
    )


def resolve_entry(entry: Entry, tf: TestFile, *, default_timeout: float, why: str = "",
               pytest_only: bool = False) -> ResolvedEntry:
    """Resolve one registry entry against what its file declares.

    CPU-tier entries are always judged as pytest files: a CPU file that runs no test
    must fail, never pass on an exit code of 0.
    """
    if tf.num_gpus is None:
        raise UsageError(f"{entry.path}: {tf.num_gpus_problem} (run `python -m ci audit`)")
    return ResolvedEntry(
        id=entry.id,
        path=entry.path,
        test_args=entry.test_args,
        env=entry.env,
        timeout=entry.timeout if entry.timeout is not None else default_timeout,
        num_gpus=tf.num_gpus,
        kind="pytest" if pytest_only else tf.kind,
        why=why,
        cores=entry.cores,
        prefork=entry.prefork,
        container=entry.container,
    )


def suite_entries(suite: Suite, files: Mapping[str, TestFile]) -> list[Entry]:
    """The registry entries of a suite: its explicit list, or its rule applied to the files."""
    return list(suite.entries) + [Entry(path=p) for p in rule_files(suite, files)]


def resolve(suite: Suite, files: Mapping[str, TestFile], *, registry: str = REGISTRY) -> list[ResolvedEntry]:
    """Every entry of `suite`, resolved; an empty suite is an error, never a silent green.

    `registry` names the file the suite came from (Registry.name) in the messages.
    """
    entries = suite_entries(suite, files)
    if not entries:
        raise NothingRegistered(
            f"nothing registered for {suite.name}: add entries to {registry} "
            f"(see docs/adding-tests.md of slime-ci)"
        )
    planned = []
    for entry in entries:
        tf = files.get(entry.path)
        if tf is None:
            raise UsageError(f"{suite.name}: registered file {entry.path} does not exist "
                             f"(fix {registry}, then run `python -m ci audit`)")
        planned.append(resolve_entry(entry, tf, default_timeout=suite.timeout,
                                  pytest_only=suite.takes_pytest_args))
    return planned


def _norm(path: str) -> str:
    p = PurePosixPath(path.replace("\\", "/"))
    parts = [x for x in p.parts if x not in (".",)]
    return PurePosixPath(*parts).as_posix() if parts else ""


def select_paths(entries: Sequence[ResolvedEntry], paths: Iterable[str], *,
                 suite: str) -> list[ResolvedEntry]:
    """Keep entries whose file is one of `paths` (a directory selects what lies under it)."""
    given = list(paths)
    if "" in given:
        raise UsageError("an empty path names no test; give a test file or directory (`.` for all)")
    wanted = [_norm(p).rstrip("/") for p in given]
    known = sorted({e.path for e in entries})
    for w in wanted:
        if not any(e.path == w or _under(e.path, w) for e in entries):
            # "." normalises to "" (the checkout itself): name it as the user can type it.
            name = w or "."
            if not known:
                raise UsageError(f"{name} is not a test of {suite}: {suite} has no entries")
            shown = ", ".join(known[:12]) + (f", … ({len(known)} in all)" if len(known) > 12 else "")
            raise UsageError(f"{name} is not a test of {suite}; known: {shown}")
    return [e for e in entries if any(e.path == w or _under(e.path, w) for w in wanted)]


def select_only(entries: Sequence[ResolvedEntry], patterns: str | Sequence[str]) -> list[ResolvedEntry]:
    """Keep entries whose id matches a glob, or contains a pattern as a substring, for any of
    `patterns`. A pattern that is an entry's whole id takes that entry alone (not the entries
    of the same file with more arguments). Each pattern must match something: a stale one is
    a mistake, not a no-op."""
    wanted = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    ids = {e.id for e in entries}

    def matches(e: ResolvedEntry, pattern: str) -> bool:
        if pattern in ids:
            return e.id == pattern
        return fnmatch.fnmatchcase(e.id, pattern) or fnmatch.fnmatchcase(e.path, pattern) or pattern in e.id

    for pattern in wanted:
        if not any(matches(e, pattern) for e in entries):
            raise UsageError(f"--only {pattern!r} matches no entry; entries: "
                             + ", ".join(e.id for e in entries[:12]))
    return [e for e in entries if any(matches(e, p) for p in wanted)]


# A shard list is built for every K: a K of a billion was a MemoryError. No CI splits a
# suite into more jobs than this.
MAX_SHARDS = 1000


def parse_shard(text: str) -> tuple[int, int]:
    """`I/K` with 1 <= I <= K."""
    try:
        left, right = text.split("/")
        index, count = int(left), int(right)
    except ValueError:
        raise UsageError(f"--shard {text!r}: expected I/K, e.g. 1/4") from None
    if count < 1 or not 1 <= index <= count:
        raise UsageError(f"--shard {text!r}: need 1 <= I <= K")
    if count > MAX_SHARDS:
        raise UsageError(f"--shard {text!r}: at most {MAX_SHARDS} shards")
    return index, count


def estimate(entry: ResolvedEntry, durations: Mapping[str, float]) -> float:
    """Measured seconds for an entry, else a guess that puts unknown entries early."""
    if entry.id in durations:
        return durations[entry.id]
    known = sorted(durations.values())
    return known[len(known) // 2] * 2 if known else entry.timeout / 10


def longest_first(entries: Sequence[ResolvedEntry], durations: Mapping[str, float]) -> list[ResolvedEntry]:
    """Order for parallel runs: longest expected first (LPT), ties by id."""
    return sorted(entries, key=lambda e: (-estimate(e, durations), e.id))


def widest_first(entries: Sequence[ResolvedEntry], durations: Mapping[str, float]) -> list[ResolvedEntry]:
    """Run order without history: entries that take more core slots first, each group longest first.

    The runner's core slots are first come, first served. A 2-core file queued behind a
    1-core one waits, with a slot idle, until that one ends; on slime's cpu_unit (2 cores,
    its 2-core files 75 % of the time) longest-first alone left a core idle behind every
    such pair. Wide files first, then the 1-core ones fill the slots to the end.
    """
    return sorted(entries, key=lambda e: (-e.cores, -estimate(e, durations), e.id))


def failure_first(entries: Sequence[ResolvedEntry], durations: Mapping[str, float], *,
                  failed: AbstractSet[str], changed: Mapping[str, int]) -> list[ResolvedEntry]:
    """Order on a branch: what failed on it before, then what its diff touches, then longest first.

    `changed`: test file -> import distance from the diff (0: the diff edits the test,
    1: it imports a changed module, 2: through one module between, …). The nearer a test
    is to the change, the likelier it is to see it; among tests equally near, the shortest
    expected reports first. Both lead to the first failure sooner. What the diff does not
    reach keeps longest first, the order that finishes a parallel run soonest.
    """
    def key(e: ResolvedEntry) -> tuple[int, int, float, str]:
        seconds = estimate(e, durations)
        if e.id in failed:
            return (0, 0, seconds, e.id)
        if e.path in changed:
            return (1, changed[e.path], seconds, e.id)
        return (2, 0, -seconds, e.id)

    return sorted(entries, key=key)


def partition(entries: Sequence[ResolvedEntry], count: int,
              durations: Mapping[str, float]) -> list[list[ResolvedEntry]]:
    """All `count` shards by LPT on measured durations: each entry to the lightest shard so far."""
    loads = [0.0] * count
    assigned: list[list[ResolvedEntry]] = [[] for _ in range(count)]
    for entry in longest_first(entries, durations):
        weight = estimate(entry, durations) * max(1, entry.num_gpus)
        target = min(range(count), key=lambda i: (loads[i], i))
        loads[target] += weight
        assigned[target].append(entry)
    return assigned


def smoke_entries(smoke: Smoke, suites: Mapping[str, Suite], files: Mapping[str, TestFile], *,
                  registry: str = REGISTRY) -> list[tuple[str, ResolvedEntry]]:
    """What a smoke runs, as (suite, entry) in its runs' order: each run's suite, narrowed by its
    `only` patterns, as the run's `python -m ci run --only` narrows it."""
    out = []
    for run in smoke.runs:
        if run.suite not in suites:
            raise UsageError(f"smoke {smoke.name} runs suite {run.suite!r}, which {registry} lacks")
        entries = resolve(suites[run.suite], files, registry=registry)
        if run.patterns:
            entries = select_only(entries, run.patterns)
        out += [(run.suite, e) for e in entries]
    return out


def smoke_shard(pairs: Sequence[tuple[str, ResolvedEntry]], index: int, count: int,
                durations: Mapping[str, float]) -> list[tuple[str, ResolvedEntry]]:
    """Shard `index` of `count` of a smoke's entries, all its suites' together, split as `partition`
    splits one suite's; one that gets no entry is an error, as `shard`'s is."""
    suite_of = {id(e): s for s, e in pairs}
    mine = shard([e for _, e in pairs], index, count, durations)
    return [(suite_of[id(e)], e) for e in mine]


def shard(entries: Sequence[ResolvedEntry], index: int, count: int,
          durations: Mapping[str, float]) -> list[ResolvedEntry]:
    """Shard `index` of `count` (`partition`); one that gets no entry is an error, never a pass.

    A matrix wider than the suite (4 shards of 3 files, a count kept after files went away)
    would give a job that runs nothing and shows green.
    """
    mine = partition(entries, count, durations)[index - 1]
    if not mine:
        raise UsageError(f"--shard {index}/{count} names no entry: the selection has "
                         f"{len(entries)}; use at most {len(entries)} shards")
    return mine
