"""Bundle placement: the pure layout.

Actors really landing on their bundles on a Ray head on loopback are checked in
`test_ray_head.py`, which shares one head with the engine actors' check.
"""

import sys

import pytest

from slime.ray.placement import COLOCATED_FRACTION, PlacementError, bundles, plan_layout

NUM_GPUS = 0


def test_colocated_shares_every_bundle():
    layout = plan_layout(4, colocate=True)
    assert layout.trainer_bundles == layout.engine_bundles == (0, 1, 2, 3)
    assert layout.trainer_gpus + layout.engine_gpus == 1.0 == 2 * COLOCATED_FRACTION
    assert layout.world_size == 4


def test_disaggregated_gives_the_last_bundles_to_engines():
    layout = plan_layout(8, colocate=False, rollout_num_gpus=3)
    assert layout.trainer_bundles == (0, 1, 2, 3, 4)
    assert layout.engine_bundles == (5, 6, 7)
    assert layout.trainer_gpus == layout.engine_gpus == 1.0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_gpus": 0, "colocate": True}, "at least one GPU"),
    ({"num_gpus": 2, "colocate": False}, "--rollout-num-gpus must leave"),
    ({"num_gpus": 2, "colocate": False, "rollout_num_gpus": 2}, "--rollout-num-gpus must leave"),
    ({"num_gpus": 4, "colocate": True, "rollout_num_gpus": 2}, "drop --rollout-num-gpus"),
    ({"num_gpus": 4, "colocate": False, "rollout_num_gpus": 2, "trainer_num_gpus": 3}, "do not fit"),
])
def test_impossible_layouts_say_which_flag(kwargs, message):
    with pytest.raises(PlacementError, match=message):
        plan_layout(**kwargs)


def test_bundles_hold_one_gpu_and_no_cpu():
    assert bundles(3) == [{"GPU": 1.0}] * 3


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
