"""The sandbox: exec-and-wait with the done marker and a time budget; the spawn gate clears."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from slime.agent.sandbox import ExecResult, LocalSandbox, ProcessHandle, SpawnGate, exec_and_wait

NUM_GPUS = 0
ENV = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}


def run(
    sandbox: LocalSandbox, command: str, *, budget_s: float = 10, gate: SpawnGate | None = None
) -> ExecResult:
    coro = exec_and_wait(sandbox, command, env=ENV, budget_s=budget_s, gate=gate or SpawnGate())
    return asyncio.run(asyncio.wait_for(coro, budget_s + 10))


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); it counts as ended once it is no longer running.
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(") ")[1].startswith("Z")


def wait_gone(pid: int, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return False


def test_exit_status_and_output_come_back(tmp_path: Path) -> None:
    result = run(LocalSandbox(tmp_path), "echo out; echo err >&2; exit 3")
    assert result.done and not result.timed_out
    assert result.returncode == 3
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"
    # The marker and the output files are cleaned up.
    assert list(tmp_path.iterdir()) == []


def test_env_and_workdir_are_the_sandbox_s(tmp_path: Path) -> None:
    result = run(LocalSandbox(tmp_path), 'pwd; echo "$LANG"; touch made-here')
    assert result.returncode == 0
    assert result.stdout.split() == [str(tmp_path), "C.UTF-8"]
    assert (tmp_path / "made-here").exists()


def test_budget_ends_the_whole_process_group(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run(
        LocalSandbox(tmp_path), "sleep 30 & echo $! > bg.pid; echo $$ > me.pid; sleep 30", budget_s=0.6
    )
    assert not result.done and result.timed_out
    assert result.returncode is None
    assert 0.5 < result.duration_s < 5
    assert time.monotonic() - started < 8
    for name in ("bg.pid", "me.pid"):
        assert wait_gone(int((tmp_path / name).read_text())), f"{name} still running"


def test_done_marker_ends_leftover_background_work(tmp_path: Path) -> None:
    # The agent exits but leaves a child behind; done means done, and the child is ended.
    result = run(LocalSandbox(tmp_path), "sleep 30 & echo $! > bg.pid; exit 0")
    assert result.done and result.returncode == 0 and not result.timed_out
    assert result.duration_s < 5
    assert wait_gone(int((tmp_path / "bg.pid").read_text()))


def test_killed_command_is_not_done_and_not_timed_out(tmp_path: Path) -> None:
    # The wrapper itself dies (as when a remote exec is torn down): no marker, no status.
    result = run(LocalSandbox(tmp_path), "kill -9 $$")
    assert not result.done and not result.timed_out
    assert result.returncode is None


class FailingSandbox(LocalSandbox):
    """A sandbox whose first `fail` starts raise, as a container that cannot be created."""

    def __init__(self, workdir: Path, fail: int) -> None:
        super().__init__(workdir)
        self.fail = fail

    async def start(self, command: str, env: Mapping[str, str]) -> ProcessHandle:
        if self.fail:
            self.fail -= 1
            raise OSError("sandbox could not be created")
        return await super().start(command, env)


def test_spawn_gate_clears_after_a_failed_start(tmp_path: Path) -> None:
    gate = SpawnGate(limit=1)
    sandbox = FailingSandbox(tmp_path, fail=1)
    with pytest.raises(OSError, match="could not be created"):
        run(sandbox, "true", gate=gate)
    assert gate.in_use == 0
    # The next call, on a new event loop, gets the slot at once.
    result = run(sandbox, "exit 7", gate=gate, budget_s=5)
    assert result.returncode == 7
    assert gate.in_use == 0


def test_spawn_gate_clears_after_cancellation(tmp_path: Path) -> None:
    gate = SpawnGate(limit=1)

    class SlowStart(LocalSandbox):
        async def start(self, command: str, env: Mapping[str, str]) -> ProcessHandle:
            await asyncio.sleep(10)
            raise AssertionError("never reached")

    async def go() -> None:
        task = asyncio.ensure_future(
            exec_and_wait(SlowStart(tmp_path), "true", env=ENV, budget_s=5, gate=gate)
        )
        await asyncio.sleep(0.05)
        assert gate.in_use == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert gate.in_use == 0
        result = await asyncio.wait_for(
            exec_and_wait(LocalSandbox(tmp_path), "exit 0", env=ENV, budget_s=5, gate=gate), 10
        )
        assert result.done

    asyncio.run(go())


def test_spawns_are_serialised_but_runs_overlap(tmp_path: Path) -> None:
    gate = SpawnGate(limit=1)

    async def go() -> list[ExecResult]:
        sandbox = LocalSandbox(tmp_path)
        runs = [exec_and_wait(sandbox, "sleep 0.6", env=ENV, budget_s=10, gate=gate) for _ in range(4)]
        return await asyncio.wait_for(asyncio.gather(*runs), 20)

    started = time.monotonic()
    results = asyncio.run(go())
    elapsed = time.monotonic() - started
    assert all(r.done and r.returncode == 0 for r in results)
    assert gate.peak == 1  # never two starts at once
    assert elapsed < 4 * 0.6  # yet the commands ran concurrently
    assert gate.in_use == 0


def test_gate_rejects_a_zero_limit() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SpawnGate(limit=0)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
