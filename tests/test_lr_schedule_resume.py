"""A resume at every step of a short schedule equals the uninterrupted run, bitwise, on 2 gloo ranks.

The training path's own optimizer set-up (`param_groups` with weight decay on weights only,
AdamW, one `ParamScheduler`: warm-up, then cosine decay to `--min-lr`) on an FSDP2-sharded
tiny Qwen2. The uninterrupted run saves a checkpoint after every step; from each of them a
fresh model, optimizer and scheduler load it and train to the end. Every later loss, every
lr, every parameter, Adam's moments and the scheduler's position must be bitwise those of the
run that never stopped. Because the lr moves at every step, a load that drops the param
groups (the lr of the next update), the scheduler's position or Adam's moments fails here.
"""

import sys

import pytest
from _gloo import preload, run_ranks
from _tiny_qwen import RANK_MODULES

preload(*RANK_MODULES, "slime.backends.fsdp.checkpoint", "slime.backends.fsdp.parallel")

NUM_GPUS = 0
WORLD = 2
N_STEPS = 6
ROWS = 2  # per rank per step


def _setup():
    import torch
    from _tiny_qwen import tiny_qwen2

    from slime.backends.fsdp.lr_schedule import ParamScheduler, Schedule, param_groups
    from slime.backends.fsdp.parallel import Layout, build_mesh, parallelize

    model = parallelize(tiny_qwen2(seed=0), build_mesh(Layout(dp=WORLD), "cpu"))
    optimizer = torch.optim.AdamW(param_groups(model.named_parameters(), 0.1), lr=3e-3)
    schedule = Schedule(max_lr=3e-3, min_lr=3e-4, warmup_iters=2, decay_iters=N_STEPS - 1, style="cosine")
    return model, optimizer, ParamScheduler(optimizer, schedule)


def _snapshot(model, optimizer, scheduler):
    from torch.distributed.tensor import DTensor

    def local(t):
        return (t.to_local() if isinstance(t, DTensor) else t).detach().clone().numpy()

    names = {id(p): n for n, p in model.named_parameters()}
    return {"params": {n: local(p) for n, p in model.named_parameters()},
            "moments": {names[id(p)]: {k: local(v) for k, v in s.items()} for p, s in optimizer.state.items()},
            "groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
            "num_steps": scheduler.num_steps}


def _train(model, optimizer, scheduler, start, after_step=None):
    """Steps start..N-1; the loss and the lr per group of each."""
    from _tiny_qwen import random_batch, token_losses

    losses, lrs = {}, {}
    for step in range(start, N_STEPS):
        ids, mask = random_batch(ROWS)
        loss_tok, m = token_losses(model, ids, mask)
        loss = (loss_tok * m).sum() / m.sum()
        loss.backward()
        lrs[step] = [g["lr"] for g in optimizer.param_groups]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses[step] = float(loss.item())
        if after_step is not None:
            after_step(step)
    return losses, lrs


def uninterrupted(rank, world, root):
    from _tiny_qwen import seed_all

    from slime.backends.fsdp import checkpoint as ck

    model, optimizer, scheduler = _setup()
    seed_all(500 + rank)  # every rank draws different data
    saver = ck.Checkpointer(root, save_optimizer="gpu")

    def save(step):
        if step + 1 < N_STEPS:
            saver.save(ck.TrainState(step=step + 1), model, optimizer, scheduler)

    losses, lrs = _train(model, optimizer, scheduler, 0, save)
    saver.close()
    return {"losses": losses, "lrs": lrs, "end": _snapshot(model, optimizer, scheduler)}


def resumed_from_every_step(rank, world, root):
    from slime.backends.fsdp import checkpoint as ck

    out = {}
    for k in range(1, N_STEPS):
        model, optimizer, scheduler = _setup()
        state = ck.load(root, model, optimizer, scheduler, step=k, load_optimizer="gpu")
        assert state is not None and state.step == k
        losses, lrs = _train(model, optimizer, scheduler, k)
        out[k] = {"losses": losses, "lrs": lrs, "end": _snapshot(model, optimizer, scheduler)}
    return out


def _bitwise(a, b, what):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for key in a:
            _bitwise(a[key], b[key], f"{what}/{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _bitwise(x, y, f"{what}[{i}]")
    elif hasattr(a, "tobytes"):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{what} differs"
    else:
        assert a == b, f"{what}: {a!r} vs {b!r}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("sched")
    root = str(base / "ckpt")
    return run_ranks(uninterrupted, WORLD, base, root, timeout=180), \
        run_ranks(resumed_from_every_step, WORLD, base, root, timeout=300)


def test_the_schedule_moves_at_every_step(runs):
    full, _ = runs
    lrs = [full[0]["lrs"][s][0] for s in range(N_STEPS)]
    assert len(set(lrs)) == N_STEPS and lrs[0] == 0.0 and max(lrs) == pytest.approx(3e-3)
    assert [g["weight_decay"] for g in full[0]["end"]["groups"]] == [0.1, 0.0]
    assert full[0]["losses"] != full[1]["losses"]  # the ranks trained on different data


@pytest.mark.parametrize("k", range(1, N_STEPS))
def test_a_resume_after_step_k_equals_the_uninterrupted_run(runs, k):
    full, resumed = runs
    for rank in range(WORLD):
        f, r = full[rank], resumed[rank][k]
        assert r["lrs"] == {s: f["lrs"][s] for s in range(k, N_STEPS)}, f"rank {rank}: the lr after a resume at {k}"
        assert r["losses"] == {s: f["losses"][s] for s in range(k, N_STEPS)}, f"rank {rank}: losses"
        _bitwise(r["end"], f["end"], f"rank {rank} resumed at {k}")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
