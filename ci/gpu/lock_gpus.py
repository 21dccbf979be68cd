"""`lock-gpus`: run a command holding GPUs exclusively; `gpu-status`: who holds what, who waits.

Standard library only: it must run in a container that has nothing but Python.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from ci.args import Parser, env_name, seconds
from ci.errors import UsageError
from ci.gpu import allocator, overruns
from ci.gpu.holders import clock
from ci.proc import FORWARDED_SIGNALS, finish, signal_group, start, stop_group, wait_unreaped

DEFAULT_GRACE = 5.0
MAX_GRACE = 3600.0  # a command that needs longer to stop is a command that hangs
_FORWARDED = FORWARDED_SIGNALS

_LOCK_EPILOG = """\
examples:
  python -m ci lock-gpus --count 4 -- python tests/e2e/test_x.py --flag "a b"
  python -m ci lock-gpus --devices 0,2 --timeout 600 -- bash run.sh
  python -m ci lock-gpus --count 1 --expect 300 -- python tests/test_small.py
  python -m ci lock-gpus --print-only

Requests queue in arrival order. A later request starts early with GPUs no
earlier waiter needs, or, with --expect, on GPUs the first waiter is waiting
for if it is expected to end before they would all be free anyway (backfilling;
--no-backfill or SLIME_CI_NO_BACKFILL=1: strict FIFO). Impossible requests fail
at once (exit 2); a timeout names the holders (exit 124). SIGINT/SIGTERM/SIGHUP
go to the command's process group, then after --grace seconds SIGKILL; the exit
code is then 128+signal. Otherwise the command's own exit code passes through
(killed by signal N: 128+N).
"""


_Parser = Parser  # one line and exit 2 (via UsageError), not argparse's usage dump
def _devices(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip() != ""]
    except ValueError:
        raise UsageError(f"--devices {text!r}: expected GPU indices such as 0,2") from None


def _lock_parser() -> _Parser:
    p = _Parser(prog="python -m ci lock-gpus", epilog=_LOCK_EPILOG,
                description="Run CMD while holding GPUs exclusively (fair FIFO queue, "
                            "per-GPU flock in a shared directory).",
                formatter_class=argparse.RawDescriptionHelpFormatter)
    want = p.add_argument_group("what to hold (one of)")
    want.add_argument("--count", type=int, help="any N GPUs, all at once")
    want.add_argument("--devices", type=_devices, help="exactly these GPUs, e.g. 0,2")
    p.add_argument("--total-gpus", type=int, default=None,
                   help="GPUs on this machine (default: NVML's count, else 8)")
    p.add_argument("--timeout", type=float, default=allocator.DEFAULT_TIMEOUT,
                   help="give up waiting after this many seconds (exit 124; 0: do not wait; "
                        f"inf: wait forever; default {allocator.DEFAULT_TIMEOUT:g})")
    p.add_argument("--expect", type=float, default=None, metavar="SECONDS",
                   help="how long CMD is expected to hold the GPUs (e.g. its p90): lets it "
                        "backfill, and lets others plan around it; without it, it never "
                        "backfills")
    p.add_argument("--no-backfill", action="store_true",
                   help="strict FIFO: never start ahead of an earlier waiter on GPUs it waits "
                        f"for (also: {allocator.NO_BACKFILL_ENV}=1)")
    p.add_argument("--target-env-name", default="CUDA_VISIBLE_DEVICES",
                   help="variable that tells CMD its GPUs (default CUDA_VISIBLE_DEVICES)")
    p.add_argument("--lock-path-pattern", default=allocator.DEFAULT_PATTERN,
                   help=f"one lock file per GPU (default {allocator.DEFAULT_PATTERN})")
    p.add_argument("--print-only", action="store_true",
                   help="print the GPUs a request could take now; hold nothing, run nothing")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE,
                   help="seconds between forwarding a signal and SIGKILL "
                        f"(default 5, at most {MAX_GRACE:g})")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    return p


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """(flags, command): everything after the first `--` is the command, untouched."""
    args = list(argv)
    if "--" in args:
        i = args.index("--")
        return args[:i], args[i + 1:]
    return args, None


# ---------------------------------------------------------------- running the command


class _Supervisor:
    """Runs the command in its own process group; forwards signals; cleans the group up."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.proc: subprocess.Popen[bytes] | None = None
        self.signalled: int | None = None
        self.starting = False  # from here on a signal is the command's, not the queue's
        self.reaped = False
        self._killer: threading.Timer | None = None
        self._lock = threading.Lock()

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        with self._lock:
            first = self.signalled is None
            self.signalled = self.signalled or signum
        if not self.starting:
            # Still queued: unwind (the ticket is dropped on the way out).
            raise _Signalled(signum)
        if self.proc is None or self.reaped:
            return  # not started yet (forwarded right after) or already over
        self._forward(signum, first)

    def _received(self) -> int | None:
        # A method, not the attribute: the signal handler changes it behind the code's back.
        return self.signalled

    def _forward(self, signum: int, first: bool) -> None:
        assert self.proc is not None
        signal_group(self.proc.pid, signum)
        if first:
            self._killer = threading.Timer(self.grace, signal_group,
                                           (self.proc.pid, signal.SIGKILL))
            self._killer.daemon = True
            self._killer.start()

    def run(self, command: list[str], env: dict[str, str], lease: allocator.Lease) -> int:
        if (early := self._received()) is not None:
            return 128 + early
        self.starting = True
        try:
            # pass_fds: the command's process tree holds the GPU locks too, so they stay
            # held even if this wrapper is SIGKILLed while the command runs.
            # No guard: a command outlives a SIGKILLed wrapper and keeps its GPUs locked,
            # so nobody else is handed GPUs that are still in use.
            self.proc = start(command, env=env, pass_fds=lease.fds)
        except FileNotFoundError:
            print(f"lock-gpus: command not found: {command[0]}", file=sys.stderr)
            return 127
        except PermissionError:
            print(f"lock-gpus: cannot execute {command[0]}", file=sys.stderr)
            return 126
        pid = self.proc.pid
        if (early := self._received()) is not None:  # came while the command started
            self._forward(early, True)
        lease.note_child(pid)
        # Wait without reaping: while the leader is a zombie its pid (= the group id)
        # cannot be reused, so the signals below reach only this command's group.
        wait_unreaped(pid)
        if self._killer is not None:
            self._killer.cancel()
        self._stop_leftovers(pid)
        self.reaped = True
        code = finish(self.proc)
        if (got := self._received()) is not None:
            return 128 + got
        return code

    def _stop_leftovers(self, pgid: int) -> None:
        # Background processes the command left behind inherit the lock descriptors and
        # would keep its GPUs held; the command is over, so they go too.
        stop_group(pgid, self.grace)


class _Signalled(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def main(argv: Sequence[str]) -> int:
    """`lock-gpus [flags] -- CMD...`: hold GPUs, run CMD with them, release; exit as CMD."""
    flags, command = split_command(argv)
    opts = _lock_parser().parse_args(flags)
    if command is None:
        command = list(opts.command)
    elif opts.command:
        raise UsageError(f"unexpected {shlex.join(opts.command)!r} before --; "
                         "put options before -- and the command after it")
    pattern = allocator.validate_pattern(opts.lock_path_pattern)
    total, assumed = _total_gpus(opts.total_gpus)
    seconds("--timeout", opts.timeout, zero=True, forever=True)
    # inf would overflow the SIGKILL timer, and nan would never fire it: the command would
    # outlive the signal forever.
    seconds("--grace", opts.grace, zero=True, most=MAX_GRACE)
    if opts.expect is not None:
        seconds("--expect", opts.expect, most=allocator.MAX_EXPECT)
    env_name("--target-env-name", opts.target_env_name)
    if opts.print_only:
        return _print_only(opts, pattern, total, assumed)
    allocator.make_request(count=opts.count, devices=opts.devices, total_gpus=total)
    if not command:
        raise UsageError("no command to run: add -- CMD [ARGS...] after the options")
    if assumed:
        allocator.check_files(pattern, total)  # any refusal first, as its one line
    _say_assumed("lock-gpus", assumed)

    sup = _Supervisor(opts.grace)
    previous = {sig: signal.signal(sig, sup.on_signal) for sig in _FORWARDED}
    text = shlex.join(command)
    try:
        with allocator.hold(count=opts.count, devices=opts.devices, total_gpus=total,
                           lock_path_pattern=pattern, timeout=opts.timeout,
                           command=text, expect=opts.expect,
                           backfill=False if opts.no_backfill else None) as lease:
            visible = ",".join(map(str, lease.devices))
            print(f"lock-gpus: holding GPU(s) {visible} "
                  f"({opts.target_env_name}={visible}) for: {text}", file=sys.stderr, flush=True)
            env = dict(os.environ, **{opts.target_env_name: visible})
            return sup.run(command, env, lease)
    except _Signalled as exc:
        print(f"lock-gpus: {signal.Signals(exc.signum).name} while waiting; gave up",
              file=sys.stderr)
        return 128 + exc.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _total_gpus(given: int | None) -> tuple[int, bool]:
    """(`--total-gpus`, else NVML's count, else 8; whether that 8 was assumed)."""
    if given is not None:
        return allocator.check_total(given), False
    found = allocator.nvml_gpu_count()
    return (found, False) if found is not None else (allocator.DEFAULT_TOTAL_GPUS, True)


def _say_assumed(prog: str, assumed: bool) -> None:
    # Said once the request is valid, just before acting on it: a refusal stays one line.
    # Without it a machine with no GPU queued for 8 that do not exist, which no one guessed.
    if assumed:
        print(f"{prog}: NVML reports no GPU here (no driver, library or device); assuming "
              f"{allocator.DEFAULT_TOTAL_GPUS}: pass --total-gpus N to say how many",
              file=sys.stderr, flush=True)


def _print_only(opts: argparse.Namespace, pattern: str, total: int, assumed: bool) -> int:
    req = (allocator.make_request(count=opts.count, devices=opts.devices, total_gpus=total)
           if opts.count is not None or opts.devices is not None else None)
    free = allocator.free_now(pattern, total)
    _say_assumed("lock-gpus", assumed)
    print(",".join(map(str, free)))
    if req is not None:
        mine, _ = allocator.claim(req.count, req.devices, list(free))
        verdict = (f"could start now on {','.join(map(str, mine))}" if len(mine) >= req.size
                   else "would wait")
        print(f"{req.describe()}: {verdict}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- gpu-status


def _when(ts: float | None) -> str:
    return clock(ts)


def _secs(x: float) -> str:
    return f"{x:.0f}s" if x >= 10 else f"{x:.1f}s"


def _expect_note(expect: float | None, since: float | None, now: float) -> str:
    """'expects 300s, 120s left' / 'expects 300s, OVERRUN by 20s' / 'no expectation'."""
    if expect is None:
        return "no expectation"
    if since is None:
        return f"expects {_secs(expect)}"
    left = since + expect - now
    if left < 0:
        return f"expects {_secs(expect)}, OVERRUN by {_secs(-left)}"
    return f"expects {_secs(expect)}, {_secs(left)} left"


def format_status(st: allocator.Status) -> str:
    """The `gpu-status` table: GPUs, then the queue in arrival order, the head's reservation."""
    lines = [f"{'GPU':<4} {'state':<5} {'pid':>8}  {'since':<8}  command"]
    holders: dict[allocator.Holder, list[int]] = {}
    for g in st.gpus:
        h = g.holder
        if h is None:
            lines.append(f"{g.gpu:<4} free")
            continue
        holders.setdefault(h, []).append(g.gpu)
        pid = str(h.acting_pid) if h.acting_pid is not None else "?"
        lines.append(f"{g.gpu:<4} held  {pid:>8}  {_when(h.since):<8}  {h.command}")
    for h, gpus in holders.items():
        note = _expect_note(h.expect, h.since, st.now)
        if h.expect is None and not h.passed:
            continue  # nothing to say beyond its row
        who = f"pid {h.acting_pid}" if h.acting_pid is not None else "?"
        line = f"  GPU {','.join(map(str, gpus))} ({who}): {note}"
        if h.command and h.command[:overruns.KEY_LIMIT] in st.distrusted:
            line += "; overran its last expectations: counted as ending any moment"
        if h.passed:
            line += f"; backfilled past #{', #'.join(map(str, h.passed))}"
        lines.append(line)
    if st.waiters:
        lines.append(f"queue ({len(st.waiters)} waiting, first served first):")
        for w in st.waiters:
            want = (f"GPUs {','.join(map(str, w.devices))}" if w.devices is not None
                    else f"{w.count} GPU(s)")
            notes = [f"expects {_secs(w.expect)}" if w.expect is not None
                     else "no expectation"]
            if not w.backfill:
                notes.append("strict FIFO")
            elif not w.trusted:
                notes.append("no backfilling: its command overran its last expectations")
            if w.passes:
                notes.append(f"passed {w.passes}x by backfilling")
            if w.ticket == st.head:
                notes.append("head, reserved " + (
                    "never (more GPUs than exist)" if st.reservation == float("inf")
                    else f"from {_when(st.reservation)}" if st.reservation is not None
                    and st.reservation > st.now else "now: its GPUs may free up any moment"))
            lines.append(f"  #{w.ticket} pid {w.pid} since {_when(w.since)} wants {want}: "
                         f"{w.command}")
            lines.append(f"      {'; '.join(notes)}")
    else:
        lines.append("queue: empty")
    lines += [f"ignored {why}" for why in st.ignored]
    return "\n".join(lines)


def status_as_json(st: allocator.Status) -> str:
    """The status as JSON for scripts."""
    def overrun(h: allocator.Holder | None) -> float | None:
        return h.overrun(st.now) if h is not None else None

    return json.dumps({
        "gpus": [dict(gpu=g.gpu, state="free" if g.holder is None else "held",
                      pid=g.holder.acting_pid if g.holder else None,
                      child_pid=g.holder.child_pid if g.holder else None,
                      command=g.holder.command if g.holder else None,
                      since=g.holder.since if g.holder else None,
                      expect=g.holder.expect if g.holder else None,
                      overrun=overrun(g.holder),
                      passed=list(g.holder.passed) if g.holder else []) for g in st.gpus],
        "waiters": [{"ticket": w.ticket, "pid": w.pid, "command": w.command, "since": w.since,
                     "count": w.count, "devices": list(w.devices) if w.devices else None,
                     "expect": w.expect, "backfill": w.backfill, "passes": w.passes,
                     "trusted": w.trusted}
                    for w in st.waiters],
        "head": st.head,
        "reservation": st.reservation if st.reservation != float("inf") else None,
        "ignored": list(st.ignored),
        "distrusted": list(st.distrusted),
    }, indent=2)


def status_main(argv: Sequence[str]) -> int:
    """`gpu-status`: each GPU free or held (pid, command, since) and the waiting queue."""
    p = _Parser(prog="python -m ci gpu-status",
                description="Show each GPU: free or held, holder pid, command, since when; "
                            "then the queue of waiters.")
    p.add_argument("--total-gpus", type=int, default=None,
                   help="GPUs on this machine (default: NVML's count, else 8)")
    p.add_argument("--lock-path-pattern", default=allocator.DEFAULT_PATTERN,
                   help=f"lock files (default {allocator.DEFAULT_PATTERN})")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    opts = p.parse_args(list(argv))
    total, assumed = _total_gpus(opts.total_gpus)
    st = allocator.read_status(opts.lock_path_pattern, total)
    _say_assumed("gpu-status", assumed)
    print(status_as_json(st) if opts.json else format_status(st))
    return 0
