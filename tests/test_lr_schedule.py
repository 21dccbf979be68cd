"""The training path's lr schedule and param groups (slime/backends/fsdp/lr_schedule.py).

The schedule is checked against its closed form at every step of a run (warm-up then cosine to
`--min-lr`, linear, constant), the scheduler against the lr each optimizer update really used,
the groups against which parameters a real tiny Qwen2 and the critic decay, and the checkpoint
state against the three ways a resumed run may meet a changed schedule.
"""

import itertools
import math
import sys

import pytest
import torch

from slime.backends.fsdp.lr_schedule import (
    ParamScheduler,
    Schedule,
    ScheduleError,
    param_groups,
    schedule_for,
)

NUM_GPUS = 0
MAX, MIN = 1e-3, 1e-4


def _cosine(step, warmup, decay):
    if step <= warmup:
        return MAX * step / warmup
    if step > decay:
        return MIN
    return MIN + 0.5 * (1 + math.cos(math.pi * (step - warmup) / (decay - warmup))) * (MAX - MIN)


def test_warmup_then_cosine_to_min_lr_at_every_step():
    s = Schedule(max_lr=MAX, min_lr=MIN, warmup_iters=3, decay_iters=11, style="cosine")
    got = [s.lr_at(k) for k in range(15)]
    assert got == pytest.approx([_cosine(k, 3, 11) for k in range(15)], rel=1e-12, abs=0)
    # Anchors of the closed form: 0 at the start, the peak at the warm-up's end, the mean of
    # peak and floor half-way through the decay, the floor at its end and after it.
    assert got[0] == 0.0 and got[3] == pytest.approx(MAX) and got[7] == pytest.approx((MAX + MIN) / 2)
    assert got[11] == pytest.approx(MIN) and got[12:] == [MIN] * 3
    assert all(a < b for a, b in itertools.pairwise(got[:4]))  # rising through the warm-up
    assert all(a > b for a, b in itertools.pairwise(got[3:12]))  # falling through the decay


def test_linear_at_every_step():
    s = Schedule(max_lr=MAX, min_lr=MIN, warmup_iters=2, decay_iters=10, style="linear")
    want = [MAX * k / 2 if k <= 2 else MIN + (1 - (k - 2) / 8) * (MAX - MIN) if k <= 10 else MIN
            for k in range(13)]
    assert [s.lr_at(k) for k in range(13)] == pytest.approx(want, rel=1e-12, abs=0)
    assert s.lr_at(6) == pytest.approx((MAX + MIN) / 2)


def test_constant_with_and_without_warmup():
    assert [Schedule(max_lr=MAX, decay_iters=5).lr_at(k) for k in range(8)] == [MAX] * 8
    warm = Schedule(max_lr=MAX, min_lr=MIN, init_lr=1e-5, warmup_iters=4, decay_iters=5, style="constant")
    assert [warm.lr_at(k) for k in range(7)] == pytest.approx(
        [1e-5 + (MAX - 1e-5) * k / 4 for k in range(5)] + [MAX, MAX], rel=1e-12)


def test_warmup_fraction_counts_a_share_of_the_decay():
    s = schedule_for(lr=MAX, min_lr=0.0, init_lr=0.0, style="cosine", warmup_iters=0, warmup_fraction=0.25,
                     decay_iters=None, train_iters=8)
    assert (s.warmup_iters, s.decay_iters) == (2, 8)
    with pytest.raises(ScheduleError, match="keep one"):
        schedule_for(lr=MAX, min_lr=0.0, init_lr=0.0, style="cosine", warmup_iters=1, warmup_fraction=0.25,
                     decay_iters=None, train_iters=8)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min_lr": 2 * MAX}, "--min-lr"),
    ({"warmup_iters": 5, "decay_iters": 5}, "shorter than the decay"),
    ({"style": "wsd"}, "--lr-decay-style"),
])
def test_a_schedule_that_cannot_run_is_refused(kwargs, message):
    with pytest.raises(ScheduleError, match=message):
        Schedule(**{"max_lr": MAX, "decay_iters": 10, **kwargs})


def test_each_update_uses_the_lr_of_its_step():
    """The scheduler sets the groups after each optimizer step: update k (from 0) runs at lr_at(k)."""
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    q = torch.nn.Parameter(torch.ones(2, 2, dtype=torch.float64))
    opt = torch.optim.SGD([{"params": [q]}, {"params": [p]}], lr=123.0)
    s = Schedule(max_lr=MAX, min_lr=MIN, warmup_iters=2, decay_iters=6, style="cosine")
    sched = ParamScheduler(opt, s)
    used = []
    for _ in range(8):
        used.append([g["lr"] for g in opt.param_groups])
        before = p.detach().clone()
        p.grad, q.grad = torch.ones_like(p), torch.zeros_like(q)
        opt.step()
        # SGD on a unit gradient moves each weight by exactly the lr it ran at.
        assert torch.allclose(before - p.detach(), torch.full_like(before, used[-1][1]), rtol=1e-9, atol=1e-15)
        sched.step()
    assert used == [[s.lr_at(k)] * 2 for k in range(8)]
    assert sched.state_dict()["num_steps"] == 8 and sched.state_dict()["lr"] == [MIN, MIN]


def _named_groups(model, weight_decay=0.1):
    names = {id(p): n for n, p in model.named_parameters()}
    return [(g["weight_decay"], sorted(names[id(p)] for p in g["params"]))
            for g in param_groups(model.named_parameters(), weight_decay)]


def test_groups_of_a_qwen2_decay_weights_not_biases_or_norms():
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from _tiny_qwen import tiny_qwen2

    model = tiny_qwen2()
    (wd, decayed), (no_wd, plain) = _named_groups(model)
    assert (wd, no_wd) == (0.1, 0.0)
    assert set(decayed) | set(plain) == {n for n, _ in model.named_parameters()}
    assert "model.embed_tokens.weight" in decayed and "lm_head.weight" in decayed
    assert "model.layers.0.self_attn.q_proj.weight" in decayed and "model.layers.1.mlp.down_proj.weight" in decayed
    assert "model.layers.0.self_attn.q_proj.bias" in plain  # Qwen2's q/k/v carry biases
    assert "model.layers.0.input_layernorm.weight" in plain and "model.norm.weight" in plain
    assert all(n.endswith(".bias") or "norm" in n for n in plain)
    assert not any(n.endswith(".bias") or "norm" in n for n in decayed)


def test_without_decay_or_schedule_the_update_is_the_plain_adam_one():
    """What keeps runs that name no schedule (the learning entries) as they were measured: two
    groups of AdamW at weight decay 0 under a constant schedule step exactly as one Adam group."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from _tiny_qwen import random_batch, seed_all, tiny_qwen2, token_losses

    finals = []
    for grouped in (False, True):
        model = tiny_qwen2(seed=0)
        if grouped:
            opt = torch.optim.AdamW(param_groups(model.named_parameters(), 0.0), lr=3e-3)
            sched = ParamScheduler(opt, Schedule(max_lr=3e-3, decay_iters=3))
        else:
            opt, sched = torch.optim.Adam(model.parameters(), lr=3e-3), None
        seed_all(11)
        for _ in range(3):
            ids, mask = random_batch(2)
            loss_tok, m = token_losses(model, ids, mask)
            ((loss_tok * m).sum() / m.sum()).backward()
            opt.step()
            opt.zero_grad()
            if sched is not None:
                sched.step()
        finals.append({n: p.detach().clone() for n, p in model.named_parameters()})
    start = dict(tiny_qwen2(seed=0).named_parameters())
    assert not torch.equal(finals[0]["lm_head.weight"], start["lm_head.weight"])  # it did train
    assert all(torch.equal(finals[0][n], finals[1][n]) for n in finals[0])


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from slime.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=3)


def test_the_critics_groups_and_schedule(tiny_dir):
    from slime.backends.fsdp.config import TrainerConfig
    from slime.backends.fsdp.model import ValueModel

    path = tiny_dir
    (_, decayed), (_, plain) = _named_groups(ValueModel(str(path), "cpu"))
    assert "head.weight" in decayed and "head.bias" in plain
    assert any(n.endswith("norm.weight") for n in plain)
    cfg = TrainerConfig(model_path=str(path), lr=1e-3, critic_lr=1e-2, min_lr=1e-4, lr_decay_style="cosine",
                        lr_warmup_iters=2, train_iters=6)
    policy, critic = cfg.schedule(cfg.lr), cfg.schedule(cfg.critic_lr)
    # The same shape at the critic's own peak: every lr ten times the policy's.
    assert [critic.lr_at(k) for k in range(8)] == pytest.approx([10 * policy.lr_at(k) for k in range(8)], rel=1e-12)


def _with_state(schedule, on_load, saved_schedule, steps):
    p = torch.nn.Parameter(torch.ones(1))
    saver = ParamScheduler(torch.optim.SGD([p], lr=1.0), saved_schedule)
    for _ in range(steps):
        saver.step()
    opt = torch.optim.SGD([p], lr=1.0)
    loader = ParamScheduler(opt, schedule, on_load=on_load)
    return saver.state_dict(), loader, opt


def test_a_changed_schedule_on_load_is_refused_overridden_or_adopted():
    old = Schedule(max_lr=MAX, min_lr=MIN, warmup_iters=1, decay_iters=6, style="cosine")
    new = Schedule(max_lr=MAX, min_lr=MIN, warmup_iters=1, decay_iters=6, style="linear")
    state, loader, _ = _with_state(new, "check", old, 3)
    with pytest.raises(ScheduleError, match=r"style 'cosine' \(run: 'linear'\).*--override-opt_param-scheduler"):
        loader.load_state_dict(state)
    state, loader, opt = _with_state(new, "override", old, 3)
    loader.load_state_dict(state)
    assert loader.num_steps == 3 and opt.param_groups[0]["lr"] == new.lr_at(3)
    state, loader, opt = _with_state(new, "checkpoint", old, 3)
    loader.load_state_dict(state)
    assert loader.schedule == old and loader.num_steps == 3
    loader.step()
    assert opt.param_groups[0]["lr"] == old.lr_at(4)


def test_an_unchanged_schedule_restores_the_position_and_leaves_the_groups_to_the_optimizer():
    s = Schedule(max_lr=MAX, min_lr=MIN, warmup_iters=2, decay_iters=6, style="cosine")
    state, loader, opt = _with_state(s, "check", s, 3)
    loader.load_state_dict(state)
    # The lr of the next update is the optimizer's (restored with its param groups), not rewritten here.
    assert loader.num_steps == 3 and opt.param_groups[0]["lr"] == s.lr_at(0)
    loader.step()
    assert opt.param_groups[0]["lr"] == s.lr_at(4)


def _args(tmp_path, model, *extra):
    from slime.utils.arguments import build_parser, check_training_path

    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "1+1=", "label": "2"}\n')
    args = build_parser().parse_args(["--hf-checkpoint", str(model), "--prompt-data", str(data), "--num-gpus", "1",
                                      "--colocate", "--num-rollout", "6", "--rollout-batch-size", "4", *extra])
    return check_training_path(args, {})


def test_the_command_line_builds_the_schedule_and_refuses_a_bad_one(tmp_path, tiny_dir):
    from slime.backends.fsdp.config import TrainerConfig
    from slime.utils.arguments import ArgumentsError

    args = _args(tmp_path, tiny_dir, "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine",
                 "--lr-warmup-fraction", "0.5", "--weight-decay", "0.1", "--use-checkpoint-opt_param-scheduler")
    cfg = TrainerConfig.from_args(args)
    assert cfg.schedule(cfg.lr) == Schedule(max_lr=1e-3, min_lr=1e-4, warmup_iters=3, decay_iters=6, style="cosine")
    assert (cfg.weight_decay, cfg.schedule_on_load) == (0.1, "checkpoint")
    assert TrainerConfig.from_args(_args(tmp_path, tiny_dir)).schedule(1e-5) == Schedule(max_lr=1e-5, decay_iters=6)
    for bad, message in ((("--lr-warmup-iters", "6"), "shorter than the decay"),
                         (("--min-lr", "1"), "--min-lr 1.0 must lie between"),
                         (("--weight-decay", "-1"), "--weight-decay must be >= 0"),
                         (("--override-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler"),
                          "exclude each other")):
        with pytest.raises(ArgumentsError, match=message):
            _args(tmp_path, tiny_dir, *bad)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
