"""Debug dump/replay: a rollout saved with --save-debug-rollout-data loads back as the same batch."""

import sys

import pytest
import torch

from slime.rollout.batch import TrainBatch, batch_from_groups, dump_path, load_batch, save_batch
from slime.utils.types import Sample

NUM_GPUS = 0


def groups():
    out = []
    for g in range(2):
        grp = []
        for k in range(3):
            s = Sample(group_index=g, index=g * 3 + k, tokens=[1, 5 + g, 7, 9 + k, 2], response_length=2,
                       reward=float(k == 1), loss_mask=[1, 1], rollout_log_probs=[-0.5 - k, -0.25])
            s.apply_finish_reason("stop")
            grp.append(s)
        out.append(grp)
    return out


def test_grpo_rewards_are_normalised_per_group():
    batch = batch_from_groups(groups(), rollout_id=4, advantage_estimator="grpo", weight_version=3)
    assert batch.raw_rewards == (0.0, 1.0, 0.0, 0.0, 1.0, 0.0)
    for g in range(2):
        part = torch.tensor(batch.rewards[3 * g: 3 * g + 3])
        assert abs(float(part.mean())) < 1e-6 and float(part[1]) > 0 > float(part[0])
    ppo = batch_from_groups(groups(), rollout_id=4, advantage_estimator="ppo", weight_version=3)
    assert ppo.rewards == ppo.raw_rewards


def test_round_trip_is_exact(tmp_path):
    batch = batch_from_groups(groups(), rollout_id=7, advantage_estimator="grpo", weight_version=2,
                              stats={"filter/dropped_groups": 1.0})
    template = str(tmp_path / "dump" / "rollout_{rollout_id}.pt")
    path = save_batch(batch, template)
    assert path == dump_path(template, 7) and path.is_file()
    assert load_batch(template, 7) == batch


def test_missing_dump_says_how_to_make_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="save it with --save-debug-rollout-data"):
        load_batch(str(tmp_path / "rollout_{rollout_id}.pt"), 0)


def test_foreign_file_is_refused(tmp_path):
    torch.save({"something": 1}, tmp_path / "rollout_0.pt")
    with pytest.raises(ValueError, match="not a rollout dump"):
        load_batch(str(tmp_path / "rollout_{rollout_id}.pt"), 0)


def test_inconsistent_batch_is_refused():
    with pytest.raises(ValueError, match="disagree"):
        TrainBatch(rollout_id=0, n_samples_per_prompt=1, tokens=((1, 2, 3),), response_lengths=(2,),
                   loss_masks=((1,),), raw_rewards=(0.0,), rewards=(0.0,), rollout_log_probs=((-1.0, -1.0),),
                   weight_version=0)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
