"""A step is "latest" only once complete: a saving process killed by pid mid-way is never loaded.

Real child processes save a real DCP checkpoint and are SIGKILLed at two points:
while rank shards are being written, and after the shards but before the marker.
Loading afterwards must give the previous step, bit for bit.
"""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from slime.backends.fsdp import checkpoint as ck

NUM_GPUS = 0
ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import sys, time, torch
    import torch.distributed.checkpoint as dcp
    from slime.backends.fsdp import checkpoint as ck

    root, where = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    saver = ck.Checkpointer(root, save_optimizer="cpu")

    def step():
        model(torch.randn(3, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    step()
    saver.save(ck.TrainState(step=1, data_cursor=3), model, opt)
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, root + "/weights_step1.pt")
    step()

    def hang(*args, **kwargs):
        print("HANGING", flush=True)
        time.sleep(600)

    if where == "shards":
        dcp.FileSystemWriter.write_data = hang  # killed while the rank writes its shards
    else:
        ck._write_atomic = hang  # killed after every shard, before the marker
    saver.save(ck.TrainState(step=2, data_cursor=6), model, opt)
    print("NOT KILLED", flush=True)
""")


def _kill_mid_save(root: Path, where: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = root / "child.err"
    with log.open("w") as err, subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), where], env=env,
        stdout=subprocess.PIPE, stderr=err, text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # the child prints as it enters the hang
            assert line.strip() == "HANGING", f"child never reached the save: {line!r}\n{log.read_text()}"
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log.unlink()


@pytest.mark.parametrize("where", ["shards", "marker"])
def test_save_killed_midway_loads_previous_step(tmp_path, where):
    _kill_mid_save(tmp_path, where)
    assert (tmp_path / "iter_0000002").is_dir()  # the half-written step is there...
    assert (tmp_path / ck.LATEST).read_text().strip() == "1"  # ...but not latest
    assert (tmp_path / "iter_0000002" / ".metadata").exists() == (where == "marker")

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    state = ck.load(tmp_path, model, opt, load_optimizer="gpu")
    assert state == ck.TrainState(step=1, data_cursor=3)
    expected = torch.load(tmp_path / "weights_step1.pt")
    for k, v in model.state_dict().items():
        assert torch.equal(v, expected[k]), k
    assert opt.state_dict()["state"][0]["step"].item() == 1.0
    # No temp files of the marker left behind by the kill.
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_ckpt_step_refuses_an_incomplete_step(tmp_path):
    _kill_mid_save(tmp_path, "shards")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ck.CheckpointError, match=r"step 2 has no complete checkpoint .*complete steps: iter_0000001"):
        ck.load(tmp_path, model, step=2)


def _tiny(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 4)


def test_ckpt_step_loads_the_step_asked_for(tmp_path):
    saver = ck.Checkpointer(tmp_path, save_optimizer=None)
    for step in (1, 2, 3):
        saver.save(ck.TrainState(step=step, rollout_id=10 * step), _tiny(step))
    assert ck.latest_step(tmp_path) == 3
    model = _tiny(0)
    assert ck.load(tmp_path, model, step=2) == ck.TrainState(step=2, rollout_id=20)
    assert torch.equal(model.weight, _tiny(2).weight)
    assert ck.load(tmp_path, model).step == 3


def test_rng_states_are_restored(tmp_path):
    import random

    import numpy as np

    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    ck.Checkpointer(tmp_path, save_optimizer=None).save(ck.TrainState(step=1), _tiny(0))
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    ck.load(tmp_path, _tiny(0))
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and (got[1] == expected[1]).all() and got[2] == expected[2]


def test_missing_optimizer_state_is_one_clear_error(tmp_path):
    model = _tiny(0)
    ck.Checkpointer(tmp_path, save_optimizer=None).save(ck.TrainState(step=1), model)
    with pytest.raises(ck.CheckpointError, match="holds no optimizer state"):
        ck.load(tmp_path, model, torch.optim.Adam(model.parameters()), load_optimizer="cpu")


def test_bad_marker_and_bad_location(tmp_path):
    assert ck.latest_step(tmp_path) is None
    assert ck.load(tmp_path, _tiny(0)) is None
    (tmp_path / ck.LATEST).write_text("oops")
    with pytest.raises(ck.CheckpointError, match="not a step number"):
        ck.latest_step(tmp_path)
    with pytest.raises(ck.CheckpointError, match="use one of gpu, cpu"):
        ck.Checkpointer(tmp_path, save_optimizer="disk")  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", *sys.argv[1:]]))
