"""A trainer rank leaves its process group only after its background checkpoint save.

Two real FSDP2 ranks on gloo start an async save and shut down at once, as a run that ends
right after its last save does. Leaving first would end the save's gloo group under its
collectives (and the step would never be marked latest); shutdown finishes the save, marks
it, then leaves, and a fresh load finds it.
"""

import sys

import pytest
from _gloo import preload, run_ranks

NUM_GPUS = 0
preload("transformers", "transformers.models.qwen2.modeling_qwen2", "slime.backends.fsdp.checkpoint")


def save_then_shut_down(rank, world, model, root):
    import torch.distributed as dist

    from slime.backends.fsdp import checkpoint as ck
    from slime.backends.fsdp.config import TrainerConfig
    from slime.backends.fsdp.rank import TrainRank

    trainer = TrainRank(rank=rank, world_size=world, master_addr="", master_port=0, device="cpu",
                        config=TrainerConfig(model_path=model, lr=1e-2))
    trainer.save_checkpoint(root, rollout_id=3, data_cursor=12, save_optimizer="cpu", async_save=True)
    pending = trainer._checkpointer.pending_step
    trainer.shutdown()
    return pending, ck.latest_step(root), dist.is_initialized()


def test_shutdown_finishes_the_background_save_before_leaving(tmp_path):
    from slime.model.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "model", seed=0, hidden_size=32, intermediate_size=64)
    root = tmp_path / "ckpt"
    out = run_ranks(save_then_shut_down, 2, tmp_path, str(model), str(root), timeout=120)
    assert out == [(0, 0, False), (0, 0, False)]
    assert any(root.glob("iter_*/.metadata")), "the save was never written"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
