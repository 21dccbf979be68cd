"""`python -m ci plants`: every planted break makes the entry that claims it fail, for its reason.

A plant is a patch of the framework kept beside the tests, `tests/e2e/plants/<entry>/<break>.patch`,
whose header (the lines before the diff, which `git apply` ignores) names what catches it:

    suite: ckpt                                  the suite of the entry
    only: gpu --load-optimizer cpu               `--only` pattern (GPU suites) or the test path (CPU)
    reason: optimizer/state/... differs          a line of the failure that must appear
    timeout: 120                                 optional: seconds its run may take (at most --timeout)

Each plant is applied to a fresh scratch copy of the checkout (tracked and untracked files,
never the working tree) and the entry runs there through `python -m ci run` with that copy
as its root, so the copy's own code is the code under test (`ci.backends.checkout`). A plant is
caught only when the run fails (exit 1) AND the failure shows its reason (in every entry's own
log, when the `only` pattern selects several); a pass, another failure, a timeout or a crash
is a miss. One table at the end; exit 1 if any was missed.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.args import Parser, seconds
from ci.errors import EXIT_FAILED, EXIT_NOTHING, EXIT_OK, UsageError
from ci.gpu.allocator import MAX_TOTAL_GPUS
from ci.proc import stop_group
from ci.registry.loader import load_registry
from ci.registry.repo_suites import PLANTS_CI, PLANTS_DIR

HEADER = re.compile(r"^(suite|only|reason|gpus|timeout):\s*(.+?)\s*$")
DEFAULT_TIMEOUT = 900.0  # seconds per plant: an emulated entry takes ~50 s on a quiet box
TOOLKIT = Path(__file__).resolve().parents[2]  # the checkout this `ci` package lives in
STOP_GRACE = 30.0  # seconds a timed-out run gets to stop its entries before SIGKILL


@dataclass(frozen=True, kw_only=True)
class Plant:
    """One planted break and what must catch it."""

    key: str  # <entry>/<break>
    patch: Path
    suite: str
    only: str
    reasons: tuple[str, ...]  # any one of them must show (a message being reworded has two)
    gpus: int = 8
    timeout: float | None = None  # its own bound on the run's seconds; --timeout still caps it


@dataclass(frozen=True, kw_only=True)
class Verdict:
    plant: Plant
    caught: bool
    why: str
    seconds: float


def read_plant(path: Path, plants_dir: Path) -> Plant:
    """The plant a patch file declares; a missing field is a one-line error naming the file."""
    fields: dict[str, str] = {}
    reasons: list[str] = []
    for line in _header_lines(path):
        m = HEADER.match(line)
        if m:
            fields[m.group(1)] = m.group(2)
            if m.group(1) == "reason":
                reasons.append(m.group(2))
    missing = [k for k in ("suite", "only", "reason") if k not in fields]
    if missing:
        raise UsageError(f"{path}: header lacks {', '.join(missing)}: (suite:, only:, reason: lines "
                         "before the diff)")
    # ASCII digits only: "²".isdigit() is true, and int("²") raises.
    gpus = fields.get("gpus", "8")
    if not re.fullmatch(r"[0-9]{1,3}", gpus) or not 1 <= int(gpus) <= MAX_TOTAL_GPUS:
        raise UsageError(f"{path}: gpus: {gpus!r} is not a GPU count (1 to {MAX_TOTAL_GPUS})")
    timeout = None
    if "timeout" in fields:
        try:
            given = float(fields["timeout"])
        except ValueError:
            raise UsageError(f"{path}: timeout: {fields['timeout']!r} is not a number of seconds") from None
        timeout = seconds(f"{path}: timeout:", given, most=86400)
    key = f"{path.parent.name}/{path.stem}"
    return Plant(key=key, patch=path, suite=fields["suite"], only=fields["only"],
                 reasons=tuple(reasons), gpus=int(gpus), timeout=timeout)


def _header_lines(path: Path) -> list[str]:
    """The lines before the diff, as text; the diff itself is git's to read, in any bytes."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the plant ({exc.strerror})") from None
    lines = []
    for raw in data.splitlines():
        if raw.startswith((b"diff --git", b"--- ")):
            break
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise UsageError(f"{path}: its header is not UTF-8 text; write the suite:, only: "
                             "and reason: lines in UTF-8") from None
    return lines


def discover(root: Path) -> list[Plant]:
    base = root / PLANTS_DIR
    return [read_plant(p, base) for p in sorted(base.glob("*/*.patch"))] if base.is_dir() else []


def select(plants: Sequence[Plant], only: str | None, ci_subset: bool) -> list[Plant]:
    chosen = [p for p in plants if not ci_subset or p.key in PLANTS_CI]
    if only:
        chosen = [p for p in chosen if fnmatch.fnmatch(p.key, only) or only in p.key]
    return chosen


def scratch_copy(root: Path, dest: Path) -> None:
    """Copy the checkout's tracked and untracked (not ignored) files: what a clone would run."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=root, capture_output=True, check=False)
    if listed.returncode != 0:
        raise UsageError(f"{root} is not a git checkout: plants run on a copy of its files")
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src = root / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def apply(patch: Path, tree: Path, *, check: bool = False) -> str | None:
    """Apply (or with check, test) a patch on tree; the reason it does not apply, or None."""
    proc = subprocess.run(["git", "apply", *(["--check"] if check else []), str(patch.resolve())],
                          cwd=tree, capture_output=True, text=True, check=False)
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["failed"])[0]


def run_argv(plant: Plant, tree: Path, gpu_suite: bool) -> list[str]:
    argv = [sys.executable, "-m", "ci", "run", "--root", str(tree), "--suite", plant.suite]
    if gpu_suite:
        return [*argv, "--emulate-gpus", "--gpus", str(plant.gpus), "--only", plant.only]
    return [*argv, plant.only]


def judge(code: int | None, output: str, reasons: Sequence[str],
          entry_logs: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Caught only by a failure that shows the plant's reason (in the run's output or its
    entries' logs, `entry_logs`: each entry's log by its file name).

    A plant whose `only` selects several entries (the five ckpt layouts) is caught only when
    each of them shows the reason in its own log: one layout that stops catching the break,
    or fails for another reason (a head that did not start), is a miss, not hidden by the rest.
    """
    logs = dict(entry_logs or {})
    if code is None:
        return False, "timed out (the plant's run was killed)"
    if code == 0:
        return False, "the entry passed with the break in place"
    if code != EXIT_FAILED:
        return False, f"exit {code}, not a test failure"
    if re.search(r"\] TIMEOUT ", output):
        return False, "the entry timed out: not its stated reason"
    if len(logs) > 1:
        quiet = sorted(name for name, text in logs.items() if not any(r in text for r in reasons))
        if quiet:
            return False, (f"{len(quiet)} of {len(logs)} entries failed, but not for "
                           f"{' / '.join(map(repr, reasons))}: {', '.join(quiet)}")
        shown = [r for r in reasons if any(r in text for text in logs.values())]
        return True, f"all {len(logs)} entries: {shown[0]}"
    shown = [r for r in reasons if r in output or any(r in text for text in logs.values())]
    if not shown:
        lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
        failed = [ln for ln in lines if ln.startswith("FAILED ")] or lines[-1:] or ["no output"]
        return False, f"failed, but not for {' / '.join(map(repr, reasons))}: {failed[0][:160]}"
    return True, shown[0]


def run_plant(plant: Plant, root: Path, gpu_suite: bool, timeout: float,
              env: Mapping[str, str]) -> Verdict:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="slime-plant-") as tmp:
        tree = Path(tmp) / "checkout"
        scratch_copy(root, tree)
        problem = apply(plant.patch, tree)
        if problem is not None:
            return Verdict(plant=plant, caught=False, why=f"patch does not apply: {problem}",
                           seconds=time.monotonic() - start)
        # The copy's own packages first; the toolkit after it, for a checkout whose `ci/`
        # is only its registry (a directory without __init__.py loses to a real package).
        full = {**env, "PYTHONPATH": os.pathsep.join([str(tree), str(TOOLKIT)])}
        full.pop("GITHUB_ACTIONS", None)  # one table for the plants, not annotations per entry
        proc = subprocess.Popen(run_argv(plant, tree, gpu_suite), cwd=tree, env=full,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        code: int | None = None
        try:
            output, _ = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            output = _stop(proc)
        except BaseException:  # Ctrl-C: the run stops its own entries on SIGTERM
            _stop(proc)
            raise
        # The run prints the last lines of a failure; the reason may sit higher up in the
        # entry's full log (a pytest traceback), which lives in the copy's run directory.
        # Each attempt's log is <index>-<entry id>.log (ci/run/runner.py); a pre-imported
        # worker's own log (worker-*.log) is no entry's.
        entry_logs = {p.name: p.read_text(encoding="utf-8", errors="replace")
                      for p in sorted(tree.glob(".ci-cache/runs/*/logs/[0-9][0-9][0-9]-*.log"))}
        log = root / ".ci-cache" / "plants" / f"{plant.key.replace('/', '__')}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(output + "".join(f"\n--- entry log {name} ---\n{text}"
                                        for name, text in entry_logs.items()), encoding="utf-8")
    caught, why = judge(code, output, plant.reasons, entry_logs)
    return Verdict(plant=plant, caught=caught, why=why, seconds=time.monotonic() - start)


def _stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM the run (it stops its entries' groups and exits), SIGKILL it if it lingers."""
    output: list[str] = []

    def finished(seconds: float) -> bool:
        try:
            output.append(proc.communicate(timeout=seconds)[0])
        except subprocess.TimeoutExpired:
            return False
        return True

    stop_group(proc.pid, STOP_GRACE, finished=finished)
    return output[0] if output else proc.communicate()[0]


def table(verdicts: Sequence[Verdict]) -> str:
    rows: list[tuple[str, ...]] = [("entry", "break", "result", "reason", "seconds")]
    rows += [(*v.plant.key.split("/", 1), "caught" if v.caught else "MISSED", v.why[:90],
              f"{v.seconds:.1f}") for v in verdicts]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m ci plants", description=__doc__.splitlines()[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: cwd)")
    p.add_argument("--only", metavar="PATTERN", help="plants whose <entry>/<break> matches")
    p.add_argument("--ci", action="store_true", help="only the fast subset `nox -t ci` runs")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per plant")
    p.add_argument("--dry-run", action="store_true",
                   help="list the plants, check each applies, show each command; run nothing")
    return p


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    root = args.root.resolve()
    if not 0 < args.timeout <= 86400:
        raise UsageError(f"--timeout {args.timeout:g}: must be between 0 (exclusive) and 86400 s")
    registry = load_registry(root)
    plants = select(discover(root), args.only, args.ci)
    if not plants:
        print(f"plants: nothing matches under {root / PLANTS_DIR}", file=sys.stderr)
        return EXIT_NOTHING
    gpu = {p.key: registry[p.suite].needs_gpus for p in plants}  # an unknown suite: exit 2
    if args.dry_run:
        print(f"plants: {len(plants)}, each on a scratch copy of {root}")
        for p in plants:
            problem = apply(p.patch, root, check=True)
            stale = f"  DOES NOT APPLY: {problem}" if problem else ""
            print(f"  {p.key}  reason={' / '.join(map(repr, p.reasons))}{stale}")
            print(f"      $ {' '.join(run_argv(p, Path('<copy>'), gpu[p.key]))}")
        return EXIT_OK
    # SIGTERM (a CI job cancelled) stops the plant's run like Ctrl-C does: nothing is left behind.
    signal.signal(signal.SIGTERM, _interrupt)
    start = time.monotonic()
    verdicts = []
    for i, p in enumerate(plants, 1):
        v = run_plant(p, root, gpu[p.key], min(args.timeout, p.timeout or args.timeout), os.environ)
        print(f"[{i:>3}/{len(plants)}] {'caught' if v.caught else 'MISSED'}  {p.key}  {v.why}  "
              f"{v.seconds:.1f}s", flush=True)
        verdicts.append(v)
    print()
    print(table(verdicts))
    missed = sum(not v.caught for v in verdicts)
    print(f"plants: {len(verdicts) - missed} caught, {missed} missed in {time.monotonic() - start:.0f}s"
          f"; logs in {root / '.ci-cache' / 'plants'}")
    return EXIT_FAILED if missed else EXIT_OK
