"""The bisect's steps: the range read from git, each commit tested in a worktree of its own.

A step checks the commit out into a git worktree under a temporary directory (the user's
checkout, its HEAD, index and files are never touched; the worktrees are removed at the
end), optionally runs the project's install command there (a failure skips the commit), and
runs the entry as a session would: `python -m ci run --suite S --only E` inside that
worktree, on the emulated GPUs when asked. Its GPUs come from the GPU lock (`ci/gpu/allocator.py`):
steps running at once hold disjoint GPU sets, and the number of sets free when the bisect
starts is how many commits a round tests.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ci.bisect.search import Search, Verdict
from ci.errors import UsageError
from ci.gpu.allocator import free_now
from ci.history.store import HISTORY_ENV
from ci.interrupts import PROCESS
from ci.proc import finish, process_guard, start, stop_group, wait_exit

ATTEMPT_ENV = "SLIME_CI_BISECT_ATTEMPT"  # 1, 2, …: the attempt on this commit (seeds, logs)
COMMIT_ENV = "SLIME_CI_BISECT_COMMIT"  # the commit under test
# What a step's `ci run` must not inherit: the job's own summary, outputs and annotations.
_JOB_ONLY = ("GITHUB_STEP_SUMMARY", "GITHUB_OUTPUT", "GITHUB_ACTIONS")
# Secrets of the bisect's job that no step needs: the shared store's URL (the answer is recorded
# by the bisect, never by a step) and the job's tokens.
_SECRETS = frozenset({HISTORY_ENV, "GITHUB_TOKEN", "GH_TOKEN", "ACTIONS_RUNTIME_TOKEN"})
_PR = re.compile(r"(?:\(#(\d+)\)\s*$|^Merge pull request #(\d+))")
STEP_TIMEOUT = 4 * 3600.0
GRACE = 10.0  # seconds a step's run has to stop its entries after SIGTERM


@dataclass(frozen=True, kw_only=True)
class Commit:
    sha: str
    subject: str
    author: str
    pr: int | None

    def short(self) -> str:
        return self.sha[:10]

    def describe(self) -> str:
        pr = f", PR #{self.pr}" if self.pr is not None else ""
        return f"{self.short()} {self.subject} ({self.author}{pr})"


def git(root: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              timeout=120, check=False)
    except FileNotFoundError:
        raise UsageError("git is not installed; the bisect needs it") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise UsageError(f"git {' '.join(args)}: {lines[-1] if lines else f'exit {done.returncode}'}")
    return done.stdout


def commit_range(root: Path, good: str, bad: str) -> list[Commit]:
    """The good end, then every commit on the first-parent line up to the bad end, oldest first.

    First parents: the commits the branch itself had (each merge is one step), as the
    monitor saw them run.
    """
    if not (root / ".git").exists() and git(root, "rev-parse", "--is-inside-work-tree").strip() != "true":
        raise UsageError(f"{root} is not a git checkout; pass --root")
    shas = []
    for ref, flag in ((good, "--good"), (bad, "--bad")):
        try:
            shas.append(git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").strip())
        except UsageError:
            raise UsageError(f"{flag} {ref!r} is no commit of {root}; fetch it or check the name") from None
    good_sha, bad_sha = shas
    if good_sha == bad_sha:
        raise UsageError("--good and --bad are the same commit: nothing to bisect")
    done = subprocess.run(["git", "merge-base", "--is-ancestor", good_sha, bad_sha], cwd=root,
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise UsageError(f"--good {good} is not an ancestor of --bad {bad}: swap them, or pick a good "
                         "commit on the bad one's history")
    line = git(root, "rev-list", "--first-parent", "--reverse", f"{good_sha}..{bad_sha}").split()
    if not line or line[-1] != bad_sha:
        raise UsageError(f"--bad {bad} is not on the first-parent line after --good {good}")
    if good_sha not in git(root, "rev-list", "--first-parent", bad_sha).split():
        raise UsageError(f"--good {good} is not on the first-parent line of --bad {bad} (a commit "
                         "of a merged branch); pick a commit the branch itself had")
    return [describe_commit(root, s) for s in (good_sha, *line)]


def describe_commit(root: Path, sha: str) -> Commit:
    subject, author = git(root, "show", "-s", "--format=%s%x00%an", sha).rstrip("\n").split("\0")
    match = _PR.search(subject)
    pr = int(match.group(1) or match.group(2)) if match else None
    return Commit(sha=sha, subject=subject, author=author, pr=pr)


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    """How every step runs the entry."""

    suite: str
    entry: str  # the entry id
    emulate: bool = False
    gpus: int | None = None  # the GPUs of the host (emulated: 8)
    lock_pattern: str | None = None
    install: tuple[str, ...] = ()  # argv run in the worktree first; failing skips the commit
    run_args: tuple[str, ...] = ()  # more options for `ci run`
    timeout: float = STEP_TIMEOUT

    def run_argv(self, junit: Path) -> list[str]:
        argv = [sys.executable, "-m", "ci", "run", "--suite", self.suite, "--only", self.entry,
                "--history", "off", "--junit", str(junit), "--durations", str(junit.with_suffix(".json"))]
        if self.emulate:
            argv.append("--emulate-gpus")
        if self.gpus is not None:
            argv += ["--gpus", str(self.gpus)]
        if self.lock_pattern is not None:
            argv += ["--lock-path-pattern", self.lock_pattern]
        return argv + list(self.run_args)

    def reproduce(self, sha: str) -> str:
        """What a person types to see one commit's verdict again."""
        flags = " --emulate-gpus" if self.emulate else ""
        install = f" && {shlex.join(self.install)}" if self.install else ""
        return (f"git worktree add --detach /tmp/bisect-{sha[:10]} {sha} && cd /tmp/bisect-{sha[:10]}"
                f"{install} && python -m ci run --suite {self.suite} --only {shlex.quote(self.entry)}{flags}")


@dataclass(frozen=True, kw_only=True)
class Attempt:
    index: int  # the commit's place in the range
    number: int  # 1, 2, … on that commit
    outcome: str  # passed, failed, skipped
    seconds: float
    why: str = ""


def junit_outcome(path: Path, entry: str) -> str | None:
    """passed / failed for the entry's testsuite in a merged JUnit file; None when it is not there."""
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError):
        return None
    for suite in tree.iter("testsuite"):
        if suite.get("name") == entry:
            bad = int(suite.get("failures", "0") or 0) + int(suite.get("errors", "0") or 0)
            return "failed" if bad else "passed"
    return None


def _last_line(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1][:200] if lines else ""


class Worktrees:
    """One git worktree per slot under a private temporary directory; removed on close."""

    def __init__(self, root: Path, base: Path | None = None) -> None:
        self.root = root
        self.dir = Path(tempfile.mkdtemp(prefix="slime-ci-bisect-", dir=base))
        self._made: list[Path] = []
        self._lock = threading.Lock()

    def checkout(self, slot: int, sha: str) -> Path:
        path = self.dir / f"slot{slot}"
        if path in self._made:
            git(path, "checkout", "--quiet", "--detach", "--force", sha)
            git(path, "clean", "-fdxq")
        else:
            with self._lock:  # git locks its worktree list: one add at a time
                git(self.root, "worktree", "add", "--quiet", "--detach", str(path), sha)
                self._made.append(path)
        return path

    def close(self) -> None:
        for path in self._made:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=self.root,
                           capture_output=True, check=False)
        subprocess.run(["git", "worktree", "prune"], cwd=self.root, capture_output=True, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Steps:
    """Runs the attempts of one commit in one worktree, as many as its verdict needs."""

    plan: StepPlan
    commits: Sequence[Commit]
    trees: Worktrees
    env: Mapping[str, str]
    note: Callable[[str], None]
    log: list[Attempt] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def test(self, search: Search, index: int, slot: int) -> None:
        commit = self.commits[index]
        started = time.monotonic()
        try:
            tree = self.trees.checkout(slot, commit.sha)
        except UsageError as exc:
            self._skip(search, index, f"cannot check out: {exc}", started)
            return
        if self.plan.install:
            done = self._call(list(self.plan.install), tree, {},
                              tree / ".ci-cache" / "bisect" / "install.log")
            if done[0] != 0:
                self._skip(search, index, f"does not install: {shlex.join(self.plan.install)} exited "
                                          f"{done[0]}: {done[1]}", started)
                return
        number = 0
        while True:
            with self._lock:
                if search.settled(index):
                    return
            number += 1
            began = time.monotonic()
            junit = tree / ".ci-cache" / "bisect" / f"attempt{number}.xml"
            code, last = self._call(self.plan.run_argv(junit), tree,
                                    {ATTEMPT_ENV: str(number), COMMIT_ENV: commit.sha},
                                    junit.with_suffix(".log"))
            if PROCESS.received:
                return  # interrupted: its run was stopped, and this attempt says nothing
            outcome = junit_outcome(junit, self.plan.entry) if code in (0, 1) else None
            seconds = time.monotonic() - began
            if outcome is None:
                why = (f"its run exited {code}: {last}" if code not in (0, 1)
                       else f"entry {self.plan.entry} did not run at this commit")
                self._skip(search, index, why, began, number)
                return
            with self._lock:
                search.record(index, outcome == "passed")
                self.log.append(Attempt(index=index, number=number, outcome=outcome, seconds=seconds))
            self.note(f"  {commit.short()} attempt {number}: {outcome} in {seconds:.1f}s")

    def _skip(self, search: Search, index: int, why: str, began: float, number: int = 1) -> None:
        with self._lock:
            search.record(index, None, why)
            self.log.append(Attempt(index=index, number=number, outcome="skipped",
                                    seconds=time.monotonic() - began, why=why))
        self.note(f"  {self.commits[index].short()} skipped: {why}")

    def _call(self, argv: list[str], cwd: Path, extra: Mapping[str, str], log: Path) -> tuple[int, str]:
        """Run one command in its own process group; stop the group on a signal or the timeout."""
        env = {k: v for k, v in self.env.items() if k not in _JOB_ONLY}
        env.update(extra)
        log.parent.mkdir(parents=True, exist_ok=True)
        guard = process_guard()
        with log.open("w", encoding="utf-8") as out:
            try:
                proc = start(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, guard=guard)
            except OSError as exc:
                return 127, str(exc)
            deadline = time.monotonic() + self.plan.timeout
            timed_out = False
            while not wait_exit(proc.pid, 0.2):
                if PROCESS.received or time.monotonic() >= deadline:
                    timed_out = not PROCESS.received
                    stop_group(proc.pid, GRACE)
                    wait_exit(proc.pid)
                    break
            code = finish(proc, guard=guard)
        if timed_out:
            return 124, f"no verdict within {self.plan.timeout:g}s"
        return code, _last_line(log.read_text(encoding="utf-8", errors="replace"))


def free_sets(num_gpus: int, *, lock_pattern: str, total: int) -> int:
    """Disjoint sets of `num_gpus` GPUs free right now under the lock (0 for a CPU entry)."""
    if num_gpus <= 0:
        return 0
    return len(free_now(lock_pattern, total)) // num_gpus


@dataclass(frozen=True, kw_only=True)
class Outcome:
    search: Search
    verdict: Verdict
    refusal: str | None
    attempts: tuple[Attempt, ...]
    wall: float
    stopped: str = ""  # why the search stopped early (budget), "" when it finished


def bisect(search: Search, steps: Steps, *, max_rounds: int, progress: Callable[[str], None]) -> Outcome:
    """Round after round: test the search's next commits at once, one worktree slot each."""
    began = time.monotonic()
    stopped = ""
    with ThreadPoolExecutor(max_workers=search.width) as pool:
        while True:
            PROCESS.check()
            if len(search.rounds) >= max_rounds:
                stopped = f"stopped after {max_rounds} rounds (--max-rounds)"
                break
            batch = search.next_round()
            if not batch:
                break
            progress(f"round {len(search.rounds)}: testing {len(batch)} commit(s) at once: "
                     + " ".join(steps.commits[i].short() for i in batch))
            futures = [pool.submit(steps.test, search, i, slot) for slot, i in enumerate(batch)]
            for f in futures:
                f.result()
    return Outcome(search=search, verdict=search.verdict(), refusal=search.refusal(),
                   attempts=tuple(steps.log), wall=time.monotonic() - began, stopped=stopped)


def step_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The bisect's environment as its steps get it: without the shared store's URL (each step
    runs `--history off`; only the bisect itself records its answer) and without the job's
    GitHub credentials, nor any variable that carries the store's URL under another name."""
    env = dict(os.environ if env is None else env)
    store = env.get(HISTORY_ENV, "").strip()
    return {k: v for k, v in env.items()
            if k not in _SECRETS and not k.startswith("ACTIONS_ID_TOKEN_")
            and not (store and store in v)}
