"""Resume equals uninterrupted: FSDP2 on 2 gloo ranks, DCP save at step K, a fresh group loads and runs to N.

Parameters, Adam state and every per-step loss must be bitwise equal to the run
that never stopped, for each optimizer location on save × on load and for async
save. Under CPU ranks the "gpu" location is the rank's device, the CPU itself (see
slime/backends/fsdp/checkpoint.py): what is proven is that the on-disk format and
the load path restore the optimizer exactly from either location. The schedule (warm-up,
then decay) matters: the lr it moved lives in the optimizer's param groups, which only
`set_optimizer_state_dict` restores (tests/test_fsdp_optimizer_restore.py).
"""

import sys

import pytest
from _gloo import preload, run_ranks
from _tiny_qwen import RANK_MODULES

preload(*RANK_MODULES, "slime.backends.fsdp.checkpoint", "slime.backends.fsdp.parallel")

NUM_GPUS = 0
WORLD = 2
N_STEPS = 5
K = 2
ROWS = 4  # per rank per step

COMBOS = [("gpu", "gpu"), ("gpu", "cpu"), ("cpu", "cpu"), ("cpu", "gpu")]


def _setup(rank):
    import torch
    from _tiny_qwen import tiny_qwen2

    from slime.backends.fsdp.parallel import Layout, build_mesh, parallelize

    model = parallelize(tiny_qwen2(seed=0), build_mesh(Layout(dp=WORLD), "cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    # Warm-up then decay: a schedule restored at the wrong position changes every later lr.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3) * 0.9 ** s)
    return model, optimizer, scheduler


def _snapshot(model, optimizer):
    from torch.distributed.tensor import DTensor

    def local(t):
        # numpy, not tensors: tensors cross the result queue through shared memory
        # that dies with the worker.
        return (t.to_local() if isinstance(t, DTensor) else t).detach().clone().numpy()

    params = {n: local(p) for n, p in model.named_parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    state = {names[id(p)]: {k: local(v) for k, v in s.items()} for p, s in optimizer.state.items()}
    return params, state


def run(rank, world, roots, start_from, load_optimizer):
    """Train to N_STEPS; fresh (start_from None) saves at K into every root, else resumes from one."""
    from _tiny_qwen import random_batch, seed_all, token_losses

    from slime.backends.fsdp import checkpoint as ck
    from slime.backends.fsdp.parallel import grad_norm

    model, optimizer, scheduler = _setup(rank)
    savers = []
    if start_from is None:
        seed_all(1000 + rank)  # every rank draws different data
        state = ck.TrainState(step=0)
        savers = [ck.Checkpointer(root, save_optimizer=loc, async_save=asy) for root, loc, asy in roots]
    else:
        state = ck.load(start_from, model, optimizer, scheduler, load_optimizer=load_optimizer)
        assert state is not None and state.step == K
    losses = {}
    marker_while_pending = []
    for step in range(state.step, N_STEPS):
        ids, mask = random_batch(ROWS)
        loss_tok, m = token_losses(model, ids, mask)
        loss = (loss_tok * m).sum() / m.sum()
        loss.backward()
        grad_norm(model.parameters())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses[step] = loss.item()
        state = ck.TrainState(step=step + 1, rollout_id=step + 1, data_cursor=(step + 1) * ROWS,
                              weight_version=step + 1)
        if step + 1 == K:
            for saver in savers:
                saver.save(state, model, optimizer, scheduler)
                if saver.async_save:
                    # Async: save returned with the write still owed; not yet "latest".
                    marker_while_pending.append(ck.latest_step(saver.root))
    for saver in savers:
        saver.close()
    params, opt_state = _snapshot(model, optimizer)
    return {"losses": losses, "params": params, "opt": opt_state, "state": state,
            "marker_while_pending": marker_while_pending, "lr": scheduler.get_last_lr()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("ckpt")
    roots = [(str(base / "gpu"), "gpu", False), (str(base / "cpu"), "cpu", False),
             (str(base / "async"), "gpu", True)]
    full = run_ranks(run, WORLD, base, roots, None, None, timeout=120)
    resumed = {}
    for save_loc, load_loc in COMBOS:
        resumed[(save_loc, load_loc)] = run_ranks(run, WORLD, base, [], str(base / save_loc), load_loc, timeout=120)
    resumed["async"] = run_ranks(run, WORLD, base, [], str(base / "async"), "gpu", timeout=120)
    return base, full, resumed


def _assert_bitwise(a, b, what):
    assert a.keys() == b.keys(), what
    for k in a:
        if isinstance(a[k], dict):
            _assert_bitwise(a[k], b[k], f"{what}/{k}")
        else:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, f"{what}/{k}"
            assert a[k].tobytes() == b[k].tobytes(), f"{what}/{k} differs"


@pytest.mark.parametrize("key", [*COMBOS, "async"], ids=lambda k: "-".join(k) if isinstance(k, tuple) else k)
def test_resume_is_bitwise_equal_to_uninterrupted(runs, key):
    _, full, resumed = runs
    for rank in range(WORLD):
        f, r = full[rank], resumed[key][rank]
        assert r["losses"] == {s: f["losses"][s] for s in range(K, N_STEPS)}, f"rank {rank} losses"
        _assert_bitwise(f["params"], r["params"], f"rank {rank} params")
        _assert_bitwise(f["opt"], r["opt"], f"rank {rank} optimizer")
        assert r["lr"] == f["lr"]
        assert r["state"] == f["state"]


def test_ranks_trained_on_different_data(runs):
    _, full, _ = runs
    # Otherwise per-rank RNG restore would be untested.
    assert full[0]["losses"] != full[1]["losses"]


def test_async_save_returns_before_it_is_latest(runs):
    base, full, _ = runs
    assert [r["marker_while_pending"] for r in full] == [[None], [None]]
    from slime.backends.fsdp.checkpoint import latest_step

    assert latest_step(base / "async") == K


def test_every_rank_wrote_its_own_shards(runs):
    base, _, _ = runs
    files = sorted(p.name for p in (base / "gpu" / "iter_0000002").iterdir())
    assert ".metadata" in files
    assert {"__0_0.distcp", "__1_0.distcp", "extra_rank0.pt", "extra_rank1.pt"} <= set(files)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", *sys.argv[1:]]))
