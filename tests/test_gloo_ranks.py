"""The gloo rank helper itself (`tests/_gloo.py`): results, failures, hangs, and isolation.

Both ways of starting ranks are exercised: the zygote forked when collection ended, and the
forkserver the helper falls back to where forking is unsafe; each must keep the same promises.
"""

import os
import sys
import threading
import time

import _gloo
import psutil
import pytest
from _gloo import run_ranks

NUM_GPUS = 0

STATE = {"value": "as collected"}


def _sum_ranks(rank, world):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return rank, world, t.item(), os.getpid()


def _see_state(rank, world):
    return STATE["value"], os.environ.get("GLOO_TEST_MARK"), os.getcwd()


def _fail_on_one(rank, world):
    if rank == 1:
        raise ValueError("rank one refuses")
    return rank


def _fail_while_peer_waits(rank, world):
    import torch.distributed as dist

    if rank == 1:
        raise ValueError("rank one refuses")
    dist.barrier()  # fails when rank 1 leaves: its error must still be the one reported
    return rank


def _die_on_one(rank, world):
    if rank == 1:
        os._exit(3)
    import torch.distributed as dist

    dist.barrier()  # rank 0 would wait here for ever
    return rank


def _hang(rank, world, pid_dir):
    (pid_dir / f"{rank}.pid").write_text(str(os.getpid()))
    time.sleep(600)


def _talk(rank, world):
    print(f"hello from rank {rank}", flush=True)
    return rank


def _need_zygote():
    if _gloo._ZYGOTE is not None:
        return
    why = _gloo.fork_hazard() or "not started"
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # An xdist worker runs execnet's threads: ranks rightly come from the forkserver there.
        pytest.skip(f"no zygote in an xdist worker ({why})")
    pytest.fail(f"no zygote in this test process: {why}")


@pytest.fixture(params=["zygote", "forkserver"])
def way(request, monkeypatch):
    if request.param == "zygote":
        _need_zygote()
    else:
        monkeypatch.setattr(_gloo, "_ZYGOTE", None)
    return request.param


def test_every_rank_runs_in_its_own_process_and_reduces(way, tmp_path):
    out = run_ranks(_sum_ranks, 3, tmp_path)
    assert [(r, w, s) for r, w, s, _ in out] == [(0, 3, 6.0), (1, 3, 6.0), (2, 3, 6.0)]
    pids = {pid for *_, pid in out}
    assert len(pids) == 3 and os.getpid() not in pids


def test_a_rank_s_exception_is_reported_with_its_traceback(way, tmp_path):
    with pytest.raises(AssertionError, match=r"(?s)rank 1:.*ValueError: rank one refuses"):
        run_ranks(_fail_on_one, 2, tmp_path, timeout=60)


def test_a_rank_that_fails_is_named_even_when_its_peer_fails_on_its_departure(way, tmp_path):
    for _ in range(3):
        with pytest.raises(AssertionError, match=r"(?s)rank 1:.*ValueError: rank one refuses"):
            run_ranks(_fail_while_peer_waits, 2, tmp_path, timeout=60)


def test_a_rank_that_dies_is_named_and_its_peer_is_not_waited_for(way, tmp_path):
    start = time.monotonic()
    # Whichever is seen first: rank 1's death, or rank 0's collective failing on it.
    with pytest.raises(AssertionError, match=r"ranks \[1\] died \(exit codes \[3\]\)|rank 0:(?s:.*) by peer"):
        run_ranks(_die_on_one, 2, tmp_path, timeout=120)
    assert time.monotonic() - start < 60


def test_a_hang_is_cut_at_the_timeout_and_no_rank_is_left(way, tmp_path):
    with pytest.raises(AssertionError, match=r"ranks \[0, 1\] gave no result in 2"):
        run_ranks(_hang, 2, tmp_path, tmp_path, timeout=2)
    pids = [int((tmp_path / f"{r}.pid").read_text()) for r in range(2)]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            break
        time.sleep(0.1)
    assert alive == []


def test_ranks_do_not_see_what_a_test_changed_after_collection(way, tmp_path, monkeypatch):
    monkeypatch.setitem(STATE, "value", "changed by the test")
    monkeypatch.setenv("GLOO_TEST_MARK", "set by the test")
    monkeypatch.chdir(tmp_path)
    (seen,) = run_ranks(_see_state, 1, tmp_path)
    assert seen[0] == "as collected" and seen[1] is None and seen[2] != str(tmp_path)


def test_rank_output_is_shown_under_the_test(way, capfd, tmp_path):
    run_ranks(_talk, 2, tmp_path)
    err = capfd.readouterr().err
    assert "--- output of gloo rank 0 ---\nhello from rank 0" in err
    assert "--- output of gloo rank 1 ---\nhello from rank 1" in err


def test_a_process_with_a_thread_gets_its_ranks_from_the_forkserver(tmp_path, monkeypatch):
    # As when a test file's import leaves a thread running at collection end: the zygote
    # is refused, and every rank comes from the forkserver instead, and works.
    monkeypatch.setattr(_gloo, "_ZYGOTE", None)
    monkeypatch.setattr(_gloo, "_AS_COLLECTED", _gloo._AS_COLLECTED)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        assert _gloo.start_zygote() == "2 Python threads"
        assert _gloo._ZYGOTE is None
        assert run_ranks(_talk, 2, tmp_path) == [0, 1]
        assert [s for _, _, s, _ in run_ranks(_sum_ranks, 2, tmp_path)] == [3.0, 3.0]
    finally:
        stop.set()
        thread.join()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
