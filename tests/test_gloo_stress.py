"""run_ranks under load: ranks that finish at different moments never break one another.

The failure this guards against came at random in `cpu_unit`: a rank that ran no
collective returned and left the group while its peer was still connecting to it
("Gloo connectFullMesh failed ... Connection closed by peer"). Busy loops on every core
(normal priority: the ranks must compete for the CPU, as in a parallel CI run) make
such timing differences large and frequent; each case then runs many times in a row and
every run must pass. The real functions come from the CPU tier's own gloo files.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
from _gloo import run_ranks
from test_advantage_whitening_cp import whiten_on_rank
from test_metric_report_distributed import reduce_on_rank

NUM_GPUS = 0
EARLY_EXIT_RUNS = 40  # with no rendezvous, 10 of 100 such runs failed under this load
REAL_RUNS = 3
# A busy loop that ends when the process that started it is gone: a killed run (a runner's
# timeout, a SIGKILL) must not leave cores spinning under init.
BUSY = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"


def _leave_at_once(rank, world):
    print(f"rank {rank} leaves", flush=True)
    return rank


def _leave_unevenly(rank, world):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    if rank == 0:
        return t.item()  # rank 0 is done first; the others still run a collective among themselves
    group = dist.new_group(list(range(1, world)), use_local_synchronization=True)
    dist.all_reduce(t, group=group)
    return t.item()


@pytest.fixture(scope="module")
def load():
    """A busy loop per core, for the module's tests; stopped by process group."""
    cores = len(os.sched_getaffinity(0))
    procs = [subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
             for _ in range(max(2, cores))]
    time.sleep(0.2)
    try:
        yield len(procs)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _repeat(fn, world, runs, tmp_path):
    start = time.monotonic()
    for i in range(runs):
        out = run_ranks(fn, world, tmp_path / f"run{i}", timeout=60)
        assert len(out) == world
        yield out
    print(f"{fn.__name__} x{runs} on {world} ranks: {time.monotonic() - start:.1f}s")


@pytest.fixture
def runs_dir(tmp_path):
    for i in range(max(EARLY_EXIT_RUNS, REAL_RUNS)):
        (tmp_path / f"run{i}").mkdir()
    return tmp_path


@pytest.mark.parametrize(("world", "runs"), [(2, EARLY_EXIT_RUNS), (4, EARLY_EXIT_RUNS // 4)])
def test_ranks_that_run_no_collective_pass_every_time(load, world, runs, runs_dir):
    for out in _repeat(_leave_at_once, world, runs, runs_dir):
        assert out == list(range(world))


def test_a_rank_that_is_done_first_leaves_its_peers_in_peace(load, runs_dir):
    for out in _repeat(_leave_unevenly, 3, 2 * REAL_RUNS, runs_dir):
        assert out == [3.0, 6.0, 6.0]


def test_real_gloo_functions_of_the_cpu_tier_pass_every_time(load, runs_dir):
    first = None
    for out in _repeat(reduce_on_rank, 4, REAL_RUNS, runs_dir):
        assert first is None or out == first
        first = out
    for out in _repeat(whiten_on_rank, 4, REAL_RUNS, runs_dir):
        assert sorted(out[0]) == [2, 4] and sorted(out[3]) == [4]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
