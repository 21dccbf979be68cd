"""A PPO checkpoint holds the critic too: resume equals uninterrupted for policy and critic.

Two gloo ranks, both models FSDP2-sharded (a second tiny Qwen2 stands in for the value
model: the checkpoint path does not care what the module computes). Saved at step K with
both optimizers, loaded by a fresh group that trains on to N: straight after the load the
critic's parameters and Adam state are bitwise those saved at K, and at N those of the run
that never stopped. (DCP reads FSDP2-sharded weights into the module's own shards, so a load
that skipped only `set_model_state_dict` would still restore the critic; the planted break
`tests/e2e/plants/test_fsdp_checkpoint_critic/` reads it into a copy that never reaches it.) A checkpoint and a run that
disagree about having a critic are refused in one line.
"""

import sys

import pytest
from _gloo import preload, run_ranks
from _tiny_qwen import RANK_MODULES

preload(*RANK_MODULES, "slime.backends.fsdp.checkpoint", "slime.backends.fsdp.parallel")

NUM_GPUS = 0
WORLD = 2
N_STEPS = 4
K = 2


def _models():
    import torch
    from _tiny_qwen import tiny_qwen2

    from slime.backends.fsdp.parallel import Layout, build_mesh, parallelize

    mesh = build_mesh(Layout(dp=WORLD), "cpu")
    policy = parallelize(tiny_qwen2(seed=0), mesh)
    critic = parallelize(tiny_qwen2(seed=1), mesh)
    return (policy, torch.optim.Adam(policy.parameters(), lr=3e-3),
            critic, torch.optim.Adam(critic.parameters(), lr=1e-2))


def _local(model, optimizer):
    from torch.distributed.tensor import DTensor

    def arr(t):
        return (t.to_local() if isinstance(t, DTensor) else t).detach().clone().numpy()

    names = {id(p): n for n, p in model.named_parameters()}
    return ({n: arr(p) for n, p in model.named_parameters()},
            {names[id(p)]: {k: arr(v) for k, v in s.items()} for p, s in optimizer.state.items()})


def run(rank, world, root, resume, with_critic):
    from _tiny_qwen import random_batch, seed_all, token_losses

    from slime.backends.fsdp import checkpoint as ck

    policy, p_opt, critic, c_opt = _models()
    at_k = None
    if not resume:
        seed_all(100 + rank)
        state = ck.TrainState(step=0)
        saver = ck.Checkpointer(root, save_optimizer="cpu")
    else:
        try:
            state = ck.load(root, policy, p_opt, load_optimizer="gpu",
                            critic=critic if with_critic else None, critic_optimizer=c_opt if with_critic else None)
        except ck.CheckpointError as exc:
            return {"error": str(exc)}
        saver = None
        at_k = {"policy": _local(policy, p_opt), "critic": _local(critic, c_opt)}
    for step in range(state.step, N_STEPS):
        ids, mask = random_batch(4)
        for model, opt in ((policy, p_opt), (critic, c_opt)):
            loss_tok, m = token_losses(model, ids, mask)
            ((loss_tok * m).sum() / m.sum()).backward()
            opt.step()
            opt.zero_grad()
        state = ck.TrainState(step=step + 1, rollout_id=step + 1, data_cursor=(step + 1) * 4, weight_version=step + 1)
        if saver is not None and step + 1 == K:
            saver.save(state, policy, p_opt, critic=critic, critic_optimizer=c_opt)
            at_k = {"policy": _local(policy, p_opt), "critic": _local(critic, c_opt)}
    if saver is not None:
        saver.close()
    return {"policy": _local(policy, p_opt), "critic": _local(critic, c_opt), "at_k": at_k}


def _same(a, b, what):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for k in a:
            _same(a[k], b[k], f"{what}/{k}")
    elif isinstance(a, tuple):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{what}[{i}]")
    else:
        assert a.tobytes() == b.tobytes(), f"{what} differs"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("ppo_ckpt")
    root = str(base / "ckpt")
    full = run_ranks(run, WORLD, base, root, False, True, timeout=120)
    resumed = run_ranks(run, WORLD, base, root, True, True, timeout=120)
    without = run_ranks(run, WORLD, base, root, True, False, timeout=120)
    return full, resumed, without


def test_policy_and_critic_resume_bitwise(runs):
    full, resumed, _ = runs
    for rank in range(WORLD):
        _same(resumed[rank]["policy"], full[rank]["policy"], f"rank {rank} policy")
        _same(resumed[rank]["critic"], full[rank]["critic"], f"rank {rank} critic")


def test_load_restores_the_critic_as_saved(runs):
    """Straight after `load`, before any step: the critic's shards and Adam state are those the
    saving run held at step K (a critic left at its initial weights, or only its optimizer
    restored, fails here and names what differs)."""
    full, resumed, _ = runs
    for rank in range(WORLD):
        _same(resumed[rank]["at_k"]["critic"], full[rank]["at_k"]["critic"], f"rank {rank} critic at load")
        _same(resumed[rank]["at_k"]["policy"], full[rank]["at_k"]["policy"], f"rank {rank} policy at load")


def test_a_run_without_critic_refuses_a_ppo_checkpoint(runs):
    *_, without = runs
    assert "holds a critic and this run has none" in without[0]["error"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
