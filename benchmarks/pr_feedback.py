"""What a PR's author waits for: the slowest hosted job of a PR event, next to the sum of them all.

Hosted jobs run side by side on GitHub, so the wait is the slowest of them, set-up included.
This runs every shard of every hosted job a `pull_request` (synchronize) event runs, as
`python -m ci plan` lists them, one at a time on this machine, each from a fresh clone of
HEAD (so its set-up is the job's: a new nox venv, then the suite): with the uv cache this
machine already has (warm), or an empty one (cold), or both.

    python benchmarks/pr_feedback.py                       # warm cache, every hosted job
    python benchmarks/pr_feedback.py --cache both --json out.json
    python benchmarks/pr_feedback.py --only toolkit --narrow tests/toolkit/test_results.py \\
        tests/toolkit/test_docs.py                         # a small case: two files, split the same way
    python benchmarks/pr_feedback.py --model               # no run: each shard as the count models it
    python benchmarks/pr_feedback.py --cache cold --setup-only   # each job's set-up from an empty uv cache

What is measured is HEAD, committed: a clone holds no uncommitted edit. GPU jobs (self-hosted)
and the verdict job are not hosted CPU work and are left out. Run it on an idle machine: the
figures are wall seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci.durations import baseline  # noqa: E402
from ci.github.job_plan import Event, Job, plan, table  # noqa: E402
from ci.registry.loader import load_registry  # noqa: E402
from ci.registry.model import Smoke, Suite  # noqa: E402
from ci.select.discover import iter_test_files, read_test_file  # noqa: E402
from ci.select.entries import resolve, smoke_entries  # noqa: E402
from ci.select.shard_count import shard_walls  # noqa: E402


@dataclass(frozen=True, kw_only=True)
class Run:
    """One shard job, run alone from its own clone."""

    job: str
    shard: int  # 0: the job has no matrix
    shards: int
    cache: str  # "warm" or "cold"
    seconds: float  # the whole job: clone, set-up, suite
    rc: int
    setup_seconds: float = 0.0  # clone and `nox --install-only` (0 in a modelled figure)
    suite_ran: bool = True  # False: `--setup-only`, the job's set-up alone


def hosted_jobs(root: Path) -> list[Job]:
    """The hosted jobs a PR's new commit runs, with the shard counts the workflow has."""
    reg = load_registry(root)
    jobs = table(reg.suites, reg.style, reg.sessions, root=root)
    return [d.job for d in plan(Event(name="pull_request"), jobs) if d.runs and not d.job.self_hosted]


def modelled(root: Path, jobs: list[Job]) -> list[Run]:
    """Each shard job's wall seconds as `ci/select/shard_count.py` models them from the committed
    durations (set-up, then its longest file or its load over the hosted runner's cores): no run,
    a job with no entries to time (lint) is left out. `rc` -1 marks a modelled figure."""
    reg = load_registry(root)
    suites: dict[str, Suite] = {s.name: s for s in reg.suites}
    smokes = {x.name: x for x in reg.sessions if isinstance(x, Smoke)}
    files = {rel: read_test_file(root, rel) for rel in iter_test_files(root)}
    durations = baseline(root)
    out = []
    for job in jobs:
        if job.session in smokes:
            entries = [e for _, e in smoke_entries(smokes[job.session], suites, files)]
        elif job.session in suites:
            entries = resolve(suites[job.session], files)
        else:
            continue
        walls = shard_walls(entries, job.shards, durations, cores=reg.sharding.runner_cores,
                            setup=reg.sharding.setup_seconds)
        out += [Run(job=job.id, shard=i if job.matrix else 0, shards=job.shards, cache="model",
                    seconds=round(wall, 1), rc=-1) for i, wall in enumerate(walls, 1)]
    return out


def argv_of(job: Job, shard: int, narrow: list[str]) -> list[str]:
    """The job's command, as the workflow runs it (`--narrow` paths after the shard)."""
    args = ["nox", "-s", job.session]
    rest = (["--shard", f"{shard}/{job.shards}"] if shard else []) + narrow
    return args + (["--", *rest] if rest else [])


def run_one(job: Job, shard: int, narrow: list[str], cache: str, work: Path, log: Path, *,
            setup_only: bool = False) -> Run:
    """Clone HEAD and run the job's command in it, as its runner does, timed in two parts: the
    set-up (clone, then `nox -s S --install-only`: the venv and its installs) and the suite
    (`nox -R -s S -- ...` in that venv). Their sum is the job's wall time. `setup_only`: the
    set-up alone (what a cold cache changes)."""
    clone = work / f"{job.id}-{shard}-{cache}"
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    if cache == "cold":
        env["UV_CACHE_DIR"] = str(work / f"uv-cache-{job.id}-{shard}")
    argv = argv_of(job, shard, narrow)
    steps = [["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)],
             [*argv[:3], "--install-only"],
             [argv[0], "-R", *argv[1:]]][:2 if setup_only else 3]
    start = time.monotonic()
    setup = 0.0
    rc = 0
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n=== {job.id} shard {shard}/{job.shards} ({cache}) ===\n")
        out.flush()
        for i, step in enumerate(steps):
            rc = subprocess.run(step, cwd=clone if i else ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, check=False).returncode
            if i == 1:
                setup = time.monotonic() - start
            if rc:
                break
    seconds = time.monotonic() - start
    shutil.rmtree(clone, ignore_errors=True)  # a clone with its venv is a few GB
    return Run(job=job.id, shard=shard, shards=job.shards, cache=cache, seconds=round(seconds, 1),
               rc=rc, setup_seconds=round(setup, 1), suite_ran=not setup_only)


def summary(runs: list[Run]) -> list[str]:
    """Per cache: each shard job's wall time, then the slowest next to the sum."""
    lines = []
    for cache in sorted({r.cache for r in runs}, reverse=True):
        mine = [r for r in runs if r.cache == cache]
        for r in mine:
            name = f"{r.job} {r.shard}/{r.shards}" if r.shard else r.job
            ended = "modelled" if r.rc == -1 else f"exit {r.rc}, set-up {r.setup_seconds:.1f} s"
            lines.append(f"  {cache:<5} {name:<20} {r.seconds:7.1f} s  {ended}")
        slowest = max(mine, key=lambda r: r.seconds)
        total = sum(r.seconds for r in mine)
        if not all(r.suite_ran for r in mine):
            setups = sorted(r.setup_seconds for r in mine)
            lines.append(f"{cache}: set-up only (clone + install), median {setups[len(setups) // 2]:.1f} s, "
                         f"max {setups[-1]:.1f} s ({slowest.job})")
            continue
        lines.append(f"{cache}: slowest job {slowest.job}"
                     + (f" {slowest.shard}/{slowest.shards}" if slowest.shard else "")
                     + f" {slowest.seconds / 60:.1f} min; sum of {len(mine)} jobs {total / 60:.1f} min")
        if cache != "model":
            setups = sorted(r.setup_seconds for r in mine)
            lines.append(f"{cache}: set-up (clone + install) median {setups[len(setups) // 2]:.1f} s, "
                         f"max {setups[-1]:.1f} s")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", choices=("warm", "cold", "both"), default="warm",
                        help="the uv cache each clone's venv is built from (default: warm)")
    parser.add_argument("--only", action="append", default=[], metavar="JOB",
                        help="run only this hosted job (repeatable)")
    parser.add_argument("--narrow", nargs="+", default=[], metavar="PATH",
                        help="pass these test paths to each shard (a small case of the same split)")
    parser.add_argument("--json", type=Path, help="write the runs to this file")
    parser.add_argument("--setup-only", action="store_true",
                        help="time each job's set-up alone (clone, `nox --install-only`): with "
                             "`--cache cold`, what an empty uv cache adds to the warm figures")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--model", action="store_true",
                        help="run nothing: each shard's wall time as the shard count models it "
                             "from the committed durations (a model, not a measurement)")
    args = parser.parse_args()
    jobs = hosted_jobs(ROOT)
    known = [j.id for j in jobs]
    unknown = [x for x in args.only if x not in known]
    if unknown:
        parser.error(f"--only {unknown[0]}: not a hosted job of a PR event; jobs: {', '.join(known)}")
    jobs = [j for j in jobs if not args.only or j.id in args.only]
    caches = ["warm", "cold"] if args.cache == "both" else [args.cache]
    # A job sized by a target is a matrix even of one shard: it runs `--shard 1/1`.
    shards = [(j, s) for j in jobs for s in (range(1, j.shards + 1) if j.matrix else [0])]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=False).stdout.strip()
    print(f"PR event at {head}: {len(shards)} hosted shard job(s) of {len(jobs)} job(s); "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    if args.dry_run:
        for job, shard in shards:
            print("  " + " ".join(argv_of(job, shard, args.narrow)))
        return 0
    if args.model:
        sharding = load_registry(ROOT).sharding
        print(f"modelled from the committed durations, {sharding.runner_cores} cores (SHARDING), "
              f"{sharding.setup_seconds:.0f} s "
              "set-up a job (not measured):")
        print("\n".join(summary(modelled(ROOT, jobs))))
        return 0
    runs = []
    with tempfile.TemporaryDirectory(prefix="pr-feedback-") as tmp:
        # As a runner's workspace is: readable by the unprivileged users the rootless-slot tests
        # run the checkout's Python as (mkdtemp makes it 0700).
        Path(tmp).chmod(0o755)
        log = Path(tmp).parent / f"pr-feedback-{os.getpid()}.log"
        print(f"  output of every job: {log}")
        for cache in caches:
            for job, shard in shards:
                runs.append(run_one(job, shard, args.narrow, cache, Path(tmp), log,
                                    setup_only=args.setup_only))
                r = runs[-1]
                print(f"  {r.job} {shard or ''} ({cache}): {r.seconds:.1f} s "
                      f"(set-up {r.setup_seconds:.1f} s), exit {r.rc}", flush=True)
    print("\n".join(summary(runs)))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1) + "\n", encoding="utf-8")
    return 0 if all(r.rc == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
