"""Weight versioning: a trainer step exported for refit reaches an engine, from disk and from tensors.

One real trainer rank (FSDP2 on gloo) steps once; rank 0 writes the policy as an HF directory.
A real engine on loopback HTTP loads it with `/update_weights_from_disk`, reports the new
weight version, and its log-probs of a generated response equal the trainer's (before the
refit they did not). The tensor path (`/update_weights_from_tensor`) lands the same weights.
"""

import sys
from pathlib import Path

import pytest
from _gloo import preload, run_ranks

NUM_GPUS = 0
preload("transformers", "transformers.models.qwen2.modeling_qwen2")


def scenario(rank, world, tmp):
    import torch

    from slime.backends.engine.client import EngineClient
    from slime.backends.engine.server import EngineServer
    from slime.backends.fsdp import math as M
    from slime.backends.fsdp.config import TrainerConfig
    from slime.backends.fsdp.rank import TrainRank
    from slime.model.tiny import build_tiny_model
    from slime.rollout.batch import TrainBatch

    model = build_tiny_model(Path(tmp) / "model", seed=0, hidden_size=32, intermediate_size=64)
    trainer = TrainRank(rank=rank, world_size=world, master_addr="", master_port=0, device="cpu",
                        config=TrainerConfig(model_path=str(model), lr=1e-2))
    out = {}
    with EngineServer(model, device="cpu", seed=0, weights_dirs=[Path(tmp) / "weights"]) as server:
        client = EngineClient(server.url)
        prompt = [1, 6, 14, 7, 16]  # <bos> 2 + 3 =
        answer = client.generate(prompt, {"max_new_tokens": 3, "temperature": 1.0, "sampling_seed": 5})
        response = answer["output_ids"]
        engine_lp = [x[0] for x in answer["meta_info"]["output_token_logprobs"]]
        tokens = (tuple(prompt + response),) * 2
        r = len(response)
        batch = TrainBatch(rollout_id=0, n_samples_per_prompt=2, tokens=tokens, response_lengths=(r, r),
                           loss_masks=((1,) * r,) * 2, raw_rewards=(1.0, 0.0), rewards=(1.0, -1.0),
                           rollout_log_probs=(tuple(engine_lp),) * 2, weight_version=0)
        out["step0"] = trainer.train(batch)

        def trainer_lp(ids=response):
            n = len(ids)
            mb = M.make_micro_batch([0], (tuple(prompt + list(ids)),), (n,), ((1,) * n,), "cpu")
            with torch.no_grad():
                return M.response_log_probs(trainer._logits(trainer.policy, mb), mb, 1.0)[0][0].tolist()

        def engine_lp_of(version):
            again = client.generate(prompt, {"max_new_tokens": 3, "temperature": 1.0, "sampling_seed": 5})
            assert again["meta_info"]["weight_version"] == version
            return again["output_ids"], [x[0] for x in again["meta_info"]["output_token_logprobs"]]

        out["trainer_after"] = trainer_lp()
        out["engine_before"] = engine_lp
        path = trainer.export_hf(str(Path(tmp) / "weights" / "version_1"))
        out["files"] = sorted(p.name for p in Path(path).iterdir())
        client.update_weights_from_disk(path, weight_version="1")
        out["version_disk"] = client.weight_version()
        out["disk_ids"], out["engine_disk"] = engine_lp_of("1")
        out["trainer_disk_ids"] = trainer_lp(out["disk_ids"])
        # A second step, then the tensor path.
        trainer.train(batch)
        client.update_weights_from_tensor(trainer.full_state_dict(), weight_version="2")
        out["version_tensor"] = client.weight_version()
        out["tensor_ids"], out["engine_tensor"] = engine_lp_of("2")
        out["trainer_tensor_ids"] = trainer_lp(out["tensor_ids"])
        out["response"] = response
    return out


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refit")
    (out,) = run_ranks(scenario, 1, tmp, str(tmp), timeout=120)
    return out


def test_disk_refit_serves_the_trainers_weights(result):
    assert result["version_disk"] == "1"
    assert "config.json" in result["files"] and "tokenizer.json" in result["files"]
    assert any(f.endswith(".safetensors") for f in result["files"])
    before = max(abs(a - b) for a, b in zip(result["engine_before"], result["trainer_after"], strict=True))
    assert before > 1e-3, "the step did not change the log-probs: nothing to prove"
    # Whatever the new weights sample, the engine scores it as the trainer does.
    after = max(abs(a - b) for a, b in zip(result["engine_disk"], result["trainer_disk_ids"], strict=True))
    assert after < 1e-4, f"engine log-probs differ from the trainer's by {after:.2e} after refit"


def test_tensor_refit_serves_the_trainers_weights(result):
    assert result["version_tensor"] == "2"
    worst = max(abs(a - b) for a, b in zip(result["engine_tensor"], result["trainer_tensor_ids"], strict=True))
    assert worst < 1e-4, f"engine log-probs differ from the trainer's by {worst:.2e} after tensor refit"


def test_first_step_is_on_policy(result):
    m = result["step0"]
    assert m["check/logprob_abs_diff_max"] < 1e-4
    assert m["train/ppo_kl_abs_max"] < 1e-8


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
