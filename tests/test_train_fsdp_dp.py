"""The FSDP2 trainer on real gloo ranks: two ranks step exactly as one rank on the same batch.

Also the wiring of advantages into the loss: after one GRPO step, the samples with positive
advantage became likelier and those with negative advantage less likely; PPO (critic, GAE,
whitening over all ranks) and REINFORCE++ agree between one and two ranks too.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _gloo import preload, run_ranks

from slime.backends.fsdp.config import TrainerConfig
from slime.rollout.batch import TrainBatch

NUM_GPUS = 0
preload("transformers", "transformers.models.qwen2.modeling_qwen2")
ESTIMATORS = ("grpo", "ppo", "reinforce_plus_plus")


def build_model(path: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=24, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return path


def make_batch() -> TrainBatch:
    g = torch.Generator().manual_seed(1)
    tokens, lengths = [], []
    for i in range(8):
        n, r = 6 + i % 3, 2 + i % 3
        tokens.append(tuple(torch.randint(1, 24, (n,), generator=g).tolist()))
        lengths.append(r)
    raw = tuple(float(i % 2) for i in range(8))
    normalised = tuple(1.0 if r else -1.0 for r in raw)  # groups of two, one right one wrong
    return TrainBatch(rollout_id=0, n_samples_per_prompt=2, tokens=tuple(tokens),
                      response_lengths=tuple(lengths), loss_masks=tuple((1,) * r for r in lengths),
                      raw_rewards=raw, rewards=normalised,
                      rollout_log_probs=tuple((-3.0,) * r for r in lengths), weight_version=0)


def sample_log_probs(rank_obj, batch):
    from slime.backends.fsdp import math as M

    mb = M.make_micro_batch(range(batch.size), batch.tokens, batch.response_lengths, batch.loss_masks, "cpu")
    with torch.no_grad():
        logp, _ = M.response_log_probs(rank_obj._logits(rank_obj.policy, mb), mb, 1.0)
    return M.per_sample_mean(logp, mb.mask).numpy()


def step(rank, world, model_path):
    from slime.backends.fsdp.rank import TrainRank

    if not Path(model_path, "config.json").exists():
        build_model(Path(model_path))

    out = {}
    batch = make_batch()
    for est in ESTIMATORS:
        cfg = TrainerConfig(model_path=model_path, lr=3e-3, advantage_estimator=est, use_critic=est == "ppo",
                            kl_coef=0.05 if est != "grpo" else 0.0, use_kl_loss=est == "grpo",
                            kl_loss_coef=0.01, max_tokens_per_micro_batch=12)
        t = TrainRank(rank=rank, world_size=world, master_addr="", master_port=0, config=cfg, device="cpu")
        before = sample_log_probs(t, batch)
        metrics = t.train(batch)
        after = sample_log_probs(t, batch)
        state = t.full_state_dict()
        out[est] = {"metrics": metrics, "before": before, "after": after, "version": t.get_version(),
                    "state": None if state is None else {k: v.numpy() for k, v in state.items()}}
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    model = tmp / "model"
    one = run_ranks(step, 1, tmp, str(model), timeout=120)
    two = run_ranks(step, 2, tmp, str(model), timeout=120)
    from safetensors.numpy import load_file

    initial = load_file(str(model / "model.safetensors"))
    return one, two, initial


@pytest.mark.parametrize("est", ESTIMATORS)
def test_two_ranks_step_as_one(runs, est):
    one, two, initial = runs
    s1, s2 = one[0][est]["state"], two[0][est]["state"]
    assert two[1][est]["state"] is None  # only rank 0 holds the gathered weights
    assert sorted(s1) == sorted(s2) == sorted(initial)
    moved = max(float(np.abs(s1[k] - initial[k]).max()) for k in s1)
    assert moved > 1e-3, f"{est}: the step did not change the weights"
    worst = max(float(np.abs(s1[k] - s2[k]).max()) for k in s1)
    assert worst < 1e-5, f"{est}: 1-rank and 2-rank weights differ by {worst:.3e}"
    m1, m2 = one[0][est]["metrics"], two[0][est]["metrics"]
    assert m2["train/samples"] == m1["train/samples"] == 8
    for key in ("train/pg_loss", "train/entropy", "train/kl_loss"):
        assert m1[key] == pytest.approx(m2[key], abs=1e-5), key
    assert one[0][est]["version"] == two[1][est]["version"] == 1


def test_grpo_moves_probability_towards_positive_advantage(runs):
    one = runs[0]
    r = one[0]["grpo"]
    delta = r["after"] - r["before"]
    batch = make_batch()
    for i, adv in enumerate(batch.rewards):
        assert (delta[i] > 0) == (adv > 0), f"sample {i}: advantage {adv:+} but log-prob moved {delta[i]:+.4f}"


def test_step0_kl_is_zero_and_critic_trains(runs):
    one = runs[0]
    for est in ESTIMATORS:
        m = one[0][est]["metrics"]
        assert m["train/ppo_kl_abs_max"] < 1e-8 and m["train/kl_loss_abs_max"] < 1e-8
        assert m["train/entropy_min"] > 0
    assert one[0]["ppo"]["metrics"]["train/value_loss"] > 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
