"""What `set_optimizer_state_dict` does on resume, for each optimizer location, on CPU ranks.

`checkpoint.load` asks `get_optimizer_state_dict` for a template, lets DCP read into it,
then calls `set_optimizer_state_dict`. On CPU ranks the template's tensors ARE the
optimizer's own state tensors for both locations ("gpu" is the rank's device; "cpu"
offload is a no-op move of a CPU tensor), so DCP restores Adam's moments and step in place
and the call adds only the param groups: the learning rate a schedule moved, betas,
weight decay. So a load without the call resumes bitwise unless the lr moves: the e2e ckpt
entries train under warm-up and cosine decay and catch it (plant
tests/e2e/plants/test_tiny_ckpt/param-groups-not-restored), as do
tests/test_fsdp_checkpoint.py and tests/test_lr_schedule_resume.py. On CUDA with the "cpu" location the template is a host copy, and the call is what
moves the moments back; that half needs a GPU (tools/cuda_check.py's resume check runs
the "gpu" location only).
"""

import sys

import pytest
from _gloo import preload, run_ranks

preload("slime.backends.fsdp.checkpoint", "torch.distributed.fsdp")

NUM_GPUS = 0


def _build():
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 ** s)
    return model, optimizer, scheduler


def _state(optimizer):
    from torch.distributed.tensor import DTensor

    def local(t):
        return (t.to_local() if isinstance(t, DTensor) else t).detach().clone().numpy()

    return [{k: local(v) for k, v in s.items()} for s in optimizer.state.values()]


def probe(rank, world, root, location):
    import torch
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
    from torch.distributed.tensor import DTensor

    import slime.backends.fsdp.checkpoint as ck

    model, optimizer, scheduler = _build()
    for _ in range(3):
        model(torch.randn(4, 8)).square().sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    saved_state, saved_lr = _state(optimizer), optimizer.param_groups[0]["lr"]
    saver = ck.Checkpointer(root, save_optimizer=location)
    saver.save(ck.TrainState(step=3), model, optimizer, scheduler)
    saver.close()

    model, optimizer, _ = _build()
    template = get_optimizer_state_dict(model, optimizer, options=ck._optimizer_options(location))

    def ptr(t):
        return (t.to_local() if isinstance(t, DTensor) else t).data_ptr()

    own = {ptr(t) for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)}
    tensors = [t for s in template["state"].values() for t in s.values() if torch.is_tensor(t)]
    aliased = sum(ptr(t) in own for t in tensors)
    content = {"optimizer": template}
    import torch.distributed.checkpoint as dcp

    dcp.load(content, checkpoint_id=str(ck.step_dir(root, 3)))
    after_dcp = _state(optimizer), optimizer.param_groups[0]["lr"]
    set_optimizer_state_dict(model, optimizer, content["optimizer"])
    after_set = _state(optimizer), optimizer.param_groups[0]["lr"]
    # What the loop calls: checkpoint.load, into a fresh optimizer and schedule.
    model, optimizer, scheduler = _build()
    ck.load(root, model, optimizer, scheduler, load_optimizer=location, load_rng=False)
    after_load = _state(optimizer), optimizer.param_groups[0]["lr"]
    return {"aliased": aliased, "tensors": len(tensors), "saved": (saved_state, saved_lr),
            "after_dcp": after_dcp, "after_set": after_set, "after_load": after_load}


def _same(a, b):
    return len(a) == len(b) and all(x.keys() == y.keys() and all(x[k].tobytes() == y[k].tobytes() for k in x)
                                    for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("location", ["gpu", "cpu"])
def test_dcp_restores_moments_in_place_and_set_restores_the_param_groups(tmp_path, location):
    result = run_ranks(probe, 1, tmp_path, str(tmp_path / "ck"), location, timeout=120)[0]
    (saved, saved_lr), (dcp_state, dcp_lr), (set_state, set_lr) = (
        result["saved"], result["after_dcp"], result["after_set"])
    # The template is the optimizer's own storage, every tensor of it.
    assert result["tensors"] > 0 and result["aliased"] == result["tensors"]
    # So DCP alone restores the moments and step exactly ...
    assert _same(dcp_state, saved)
    # ... but not the learning rate the schedule moved (1e-2 * 0.5**3): only the call does.
    assert dcp_lr == pytest.approx(1e-2) and saved_lr == pytest.approx(1e-2 * 0.5 ** 3)
    assert _same(set_state, saved) and set_lr == saved_lr
    load_state, load_lr = result["after_load"]
    assert _same(load_state, saved), "checkpoint.load did not restore Adam's moments"
    assert load_lr == saved_lr, f"checkpoint.load did not restore the param groups: lr {load_lr} vs {saved_lr}"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
