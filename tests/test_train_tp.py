"""The trainer rank on dp × tp layouts (real gloo ranks): TP2 and DP2 × TP2 step as one rank does.

Also the trainer's grad-norm replay: a 1-rank run records (`ci_save_grad_norm`), the TP
layouts replay it (`ci_load_grad_norm`) with no mismatch, and the wrong normalisation
(`ci_wrong_normalisation`, several micro-batches) is reported as a mismatch.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _gloo import preload, run_ranks

from slime.backends.fsdp.config import TrainerConfig
from slime.rollout.batch import TrainBatch

preload("transformers", "transformers.models.qwen2.modeling_qwen2", "slime.backends.fsdp.rank")

NUM_GPUS = 0
LR = 3e-3


def build_model(path: Path) -> None:
    from _tiny_qwen import tiny_qwen2

    tiny_qwen2(seed=0).save_pretrained(path)


def make_batch() -> TrainBatch:
    g = torch.Generator().manual_seed(2)
    tokens, lengths = [], []
    for i in range(8):
        n, r = 6 + i % 4, 1 + i % 4  # uneven responses: normalisation matters
        tokens.append(tuple(torch.randint(1, 90, (n,), generator=g).tolist()))
        lengths.append(r)
    raw = tuple(float(i % 2) for i in range(8))
    return TrainBatch(rollout_id=0, n_samples_per_prompt=2, tokens=tuple(tokens),
                      response_lengths=tuple(lengths), loss_masks=tuple((1,) * r for r in lengths),
                      raw_rewards=raw, rewards=tuple(1.0 if r else -1.0 for r in raw),
                      rollout_log_probs=tuple((-3.0,) * r for r in lengths), weight_version=0)


def step(rank, world, tp, model_path, ref_dir, mode):
    from slime.backends.fsdp.rank import TrainRank

    cfg = TrainerConfig(model_path=model_path, lr=LR, advantage_estimator="grpo",
                        tensor_model_parallel_size=tp, calculate_per_token_loss=True,
                        max_tokens_per_micro_batch=24 if mode == "wrong" else 4096,
                        ci_save_grad_norm=ref_dir if mode == "record" else None,
                        ci_load_grad_norm=ref_dir if mode in ("replay", "wrong") else None,
                        ci_wrong_normalisation=mode == "wrong")
    t = TrainRank(rank=rank, world_size=world, master_addr="", master_port=0, config=cfg, device="cpu")
    metrics = t.train(make_batch())
    state = t.full_state_dict()
    return {"metrics": metrics, "state": None if state is None else {k: v.numpy() for k, v in state.items()}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tp")
    model, ref = tmp / "model", str(tmp / "ref")
    build_model(model)
    out = {"one": run_ranks(step, 1, tmp, 1, str(model), ref, "record", timeout=120)}
    out["tp2"] = run_ranks(step, 2, tmp, 2, str(model), ref, "replay", timeout=120)
    out["dp2xtp2"] = run_ranks(step, 4, tmp, 2, str(model), ref, "replay", timeout=120)
    out["wrong"] = run_ranks(step, 1, tmp, 1, str(model), ref, "wrong", timeout=120)
    return out


@pytest.mark.parametrize("layout", ["tp2", "dp2xtp2"])
def test_layout_steps_as_one_rank(runs, layout):
    s1, s2 = runs["one"][0]["state"], runs[layout][0]["state"]
    assert sorted(s1) == sorted(s2)
    worst = max(float(np.abs(s1[k] - s2[k]).max()) for k in s1)
    # Adam's first step moves each weight by about lr * g / |g|: for gradients near its eps,
    # the float32 reduction order of a TP layout shifts that by a few % of lr. Adam is blind
    # to a gradient's scale, so a summed-instead-of-averaged gradient shows in the grad norm
    # below; a wrong shard moves weights by multiples of lr.
    assert worst < 0.05 * LR, f"{layout}: weights differ from one rank by {worst:.3e}"
    m1, m2 = runs["one"][0]["metrics"], runs[layout][0]["metrics"]
    assert m2["train/grad_norm"] == pytest.approx(m1["train/grad_norm"], rel=1e-5)
    assert m1["train/grad_norm"] > 0


@pytest.mark.parametrize("layout", ["tp2", "dp2xtp2"])
def test_replay_matches_the_recording(runs, layout):
    for rank_out in runs[layout]:
        assert "ci/grad_norm_mismatch" not in rank_out["metrics"]


def test_wrong_normalisation_is_reported(runs):
    msg = runs["wrong"][0]["metrics"].get("ci/grad_norm_mismatch")
    assert msg is not None and msg.startswith("step 0: grad norm"), msg


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", *sys.argv[1:]]))
