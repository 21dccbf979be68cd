"""How many CI shards a suite gets: the fewest whose slowest job meets the suite's target.

A PR's author waits for the slowest of its hosted jobs, not their sum, so a suite with
`target_minutes` is split into as many parallel jobs as that takes (`Suite.shards` above 1
is a fixed count instead). The count comes from the measured seconds of its entries (the
history's p90 where a store is given, else the committed `tests/durations.json`), split
the way `--shard I/K` splits them (`ci.select.entries.partition`), each shard's wall time
modelled as its set-up plus the longer of its longest file and its load spread over the
runner's cores. No split beats the longest file: once more shards no longer shorten the
slowest one, the count stops there and says so. Pure, but for `suite_counts`, which reads
the checkout's files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath

from ci.durations import BASELINE_FILES, baseline
from ci.errors import CIError
from ci.registry.model import HOSTED_CORES, ShardPolicy, Smoke, Suite
from ci.select.discover import TestFile, iter_test_files, read_test_file
from ci.select.entries import ResolvedEntry, estimate, partition, resolve, smoke_entries

DEFAULT_POLICY = ShardPolicy()

# Where the registry sets no SHARDING: ci.registry.model.ShardPolicy's defaults, a public
# repository's 4-core hosted runner and a stated 60 s set-up. The set-up is the job's own steps
# (checkout, setup-python, pip install nox, the durations caches), the session's venv and the
# suite's `before` step; `benchmarks/pr_feedback.py` measures the venv and the suite apart.
# Ray heads start inside the files that use them, so their start-up is in those files' seconds.
SETUP_SECONDS = DEFAULT_POLICY.setup_seconds
MAX_SHARDS = DEFAULT_POLICY.max_shards
# More shards that shorten the slowest job by less than this do not help.
HELPS_SECONDS = 5.0


@dataclass(frozen=True, kw_only=True)
class ShardCount:
    """A suite's shard count and why; `minutes`: the slowest shard expected, set-up included."""

    suite: str
    count: int
    minutes: float
    why: str


def shard_walls(entries: Sequence[ResolvedEntry], count: int, durations: Mapping[str, float], *,
                cores: int, setup: float) -> list[float]:
    """Each shard's expected wall seconds: set-up, then its longest file or its load over `cores`."""
    walls = []
    for mine in partition(entries, count, durations):
        seconds = [estimate(e, durations) for e in mine]
        load = sum(s * min(e.cores, cores) for s, e in zip(seconds, mine, strict=True))
        walls.append(setup + max([*seconds, load / cores]))
    return walls


def count_shards(suite: Suite | Smoke, entries: Sequence[ResolvedEntry], durations: Mapping[str, float], *,
                 source: str, cores: int = HOSTED_CORES, setup: float = SETUP_SECONDS,
                 max_shards: int = MAX_SHARDS) -> ShardCount:
    """The fewest shards whose slowest job meets `suite.target_minutes`, else as many as still help."""
    if suite.target_minutes is None or suite.shards > 1:
        return ShardCount(suite=suite.name, count=suite.shards, minutes=0.0,
                          why=f"fixed: shards={suite.shards} in the registry")
    target = suite.target_minutes * 60
    widest = max(1, min(max_shards, len(entries)))
    slowest = {k: max(shard_walls(entries, k, durations, cores=cores, setup=setup))
               for k in range(1, widest + 1)}
    head = f"target {suite.target_minutes:g} min, {len(entries)} files by {source}"
    meets = [k for k, wall in slowest.items() if wall <= target]
    if meets:
        k = meets[0]
        return ShardCount(suite=suite.name, count=k, minutes=slowest[k] / 60,
                          why=f"{head}: {_reach(k, slowest[k])}")
    best = min(slowest.values())
    k = min(c for c, wall in slowest.items() if wall <= best + HELPS_SECONDS)
    longest = max((estimate(e, durations) for e in entries), default=0.0)
    limit = (f"longest file {longest:.0f} s" if setup + longest >= best - HELPS_SECONDS
             else f"at most {max_shards} shards")
    more = f"; {k + 1} would not help" if k < widest else ""
    return ShardCount(suite=suite.name, count=k, minutes=slowest[k] / 60,
                      why=f"{head}: {limit}: {_reach(k, slowest[k])}{more}")


def _reach(count: int, seconds: float) -> str:
    return f"{count} shard{'s reach' if count > 1 else ' reaches'} {seconds / 60:.1f} min"


def suite_counts(root: Path, suites: Sequence[Suite], *,
                 measured: Mapping[str, float] | None = None,
                 source: str = "", smokes: Sequence[Smoke] = (),
                 policy: ShardPolicy = DEFAULT_POLICY) -> dict[str, ShardCount]:
    """The count of each suite and smoke with a target, from `measured` (the history's p90)
    over the checkout's committed durations, for the runner and set-up `policy` says (the
    registry's SHARDING); the rest keep their `shards`. A smoke's entries are those its runs
    select of `suites`."""
    wanted = [s for s in suites if s.target_minutes is not None and s.shards == 1 and not s.dynamic]
    sized = [s for s in smokes if s.target_minutes is not None and s.shards == 1]
    if not wanted and not sized:
        return {}
    if not source:
        source = next((f for f in BASELINE_FILES if (root / f).is_file()), "no durations")
    if measured is None:
        try:
            return dict(_committed_counts(root, tuple(wanted), source, tuple(suites), tuple(sized),
                                          policy))
        except TypeError:  # a registry that lists entries in a list: unhashable, so not cached
            return _counts(root, wanted, baseline(root), source, suites, sized, policy)
    return _counts(root, wanted, {**baseline(root), **measured}, source, suites, sized, policy)


# The job table is built many times in one process (the workflow, its checks, the plan), and
# reading the test files is most of the cost; the committed durations and files of one
# checkout do not change while it runs.
@lru_cache(maxsize=8)
def _committed_counts(root: Path, suites: tuple[Suite, ...], source: str, every: tuple[Suite, ...],
                      smokes: tuple[Smoke, ...], policy: ShardPolicy) -> tuple[tuple[str, ShardCount], ...]:
    return tuple(_counts(root, suites, baseline(root), source, every, smokes, policy).items())


def _files(root: Path, suites: Sequence[Suite]) -> dict[str, TestFile]:
    # Only the files these suites can take: the rest of the tree is not read.
    wanted = {e.path for s in suites for e in s.entries}
    dirs = [PurePosixPath(d) for s in suites for d in s.include]
    return {rel: read_test_file(root, rel) for rel in iter_test_files(root)
            if rel in wanted or any(PurePosixPath(rel).is_relative_to(d) for d in dirs)}


def _counts(root: Path, suites: Sequence[Suite], durations: Mapping[str, float], source: str,
            every: Sequence[Suite] = (), smokes: Sequence[Smoke] = (),
            policy: ShardPolicy = DEFAULT_POLICY) -> dict[str, ShardCount]:
    by_name = {s.name: s for s in every}
    ran = [by_name[r.suite] for m in smokes for r in m.runs if r.suite in by_name]
    files = _files(root, [*suites, *ran])
    out = {}
    sized: list[Suite | Smoke] = [*suites, *smokes]
    for suite in sized:
        try:
            entries = (resolve(suite, files) if isinstance(suite, Suite)
                       else [e for _, e in smoke_entries(suite, by_name, files)])
        except CIError as exc:  # `ci run` says the same when the job runs; the plan still plans
            out[suite.name] = ShardCount(suite=suite.name, count=suite.shards, minutes=0.0,
                                         why=f"not sized: {exc}")
            continue
        if not any(e.id in durations for e in entries):
            # Guessed seconds would pick a count from nothing: keep the registry's until a run
            # has measured the suite.
            out[suite.name] = ShardCount(suite=suite.name, count=suite.shards, minutes=0.0,
                                         why=f"no measured durations: shards={suite.shards}")
            continue
        out[suite.name] = count_shards(suite, entries, durations, source=source,
                                       cores=policy.runner_cores, setup=policy.setup_seconds,
                                       max_shards=policy.max_shards)
    return out
