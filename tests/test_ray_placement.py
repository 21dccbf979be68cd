"""Bundle placement: the pure layout, and actors really landing on their bundles on a Ray head on loopback.

The head runs with four logical GPUs (as under `--emulate-gpus`): Ray hands each actor the
GPU ids of its bundle, so colocated ranks and engines share an id and disaggregated ones
never do. The head is private (own ports, temp dir) and stopped by pid at the end.
"""

import os
import sys

import psutil
import pytest

from slime.ray.placement import COLOCATED_FRACTION, PlacementError, bundles, plan_layout
from slime.utils.external_utils.ray_head import private_head

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


class Probe:
    def where(self):
        import ray

        return {"gpus": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid(),
                "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


def test_actors_land_on_their_bundles_on_a_real_head(tmp_path):
    import ray

    from slime.ray.placement import actor_options, create_placement_group

    env = {**os.environ, "TMPDIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("SLIME_CI_PORT_BASE", None)
    record = []
    with private_head(num_gpus=4, env=env, record=record) as head:
        ray.init(address=head.gcs_address, log_to_driver=False)
        try:
            # The head and everything it starts stay on loopback.
            assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.2"}
            # Workers cannot import this test file: ship the class by value.
            ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
            probe = ray.remote(Probe)
            pg = create_placement_group(4, timeout=120)
            colo = plan_layout(2, colocate=True)
            # Colocated on bundles 0 and 1: a rank and an engine per bundle, half a GPU each.
            ranks = [probe.options(**actor_options(pg, b, colo.trainer_gpus)).remote() for b in colo.trainer_bundles]
            engines = [probe.options(**actor_options(pg, b, colo.engine_gpus)).remote() for b in colo.engine_bundles]
            # Bundles 2 and 3: one whole-GPU actor each (as disaggregated engines take them).
            whole = [probe.options(**actor_options(pg, b, 1.0)).remote() for b in (2, 3)]
            r, e, w = (ray.get([a.where.remote() for a in group]) for group in (ranks, engines, whole))
            for rank, engine in zip(r, e, strict=True):
                assert len(rank["gpus"]) == 1 and rank["gpus"] == engine["gpus"], (rank, engine)
                assert rank["pid"] != engine["pid"]
            ids = [x["gpus"][0] for x in r] + [x["gpus"][0] for x in w]
            assert len(set(ids)) == 4, f"four bundles should be four GPUs, got {ids}"
            # The bundles are full now: one more actor on a bundle cannot be placed.
            extra = probe.options(**actor_options(pg, 0, 0.5)).remote()
            ready, _ = ray.wait([extra.where.remote()], timeout=3)
            assert not ready, "a bundle took more than its one GPU"
            for actor in [*ranks, *engines, *whole, extra]:
                ray.kill(actor)
        finally:
            ray.shutdown()
    (rec,) = record
    alive = [p for p in rec.pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
