"""Actors on one real Ray head on loopback, with logical GPUs as under `--emulate-gpus`.

One private head (own ports, own temp dir, four logical GPUs) serves both tests of this file
and is stopped by pid at the end: a head costs this suite about 30 CPU-seconds to start and
stop, so the placement and the engine checks share it instead of starting one each.

- Bundle placement: Ray hands each actor the GPU ids of its bundle, so colocated ranks and
  engines share an id and disaggregated ones never do (the layout itself is
  `test_ray_placement.py`).
- Engine actors: two engines in a placement group of two one-GPU bundles each report the
  logical GPU Ray gave them, run on the CPU (`SLIME_CI_DEVICE=cpu`,
  `SLIME_CI_EMULATE_GPUS=1`), serve HTTP from their own processes, and ask for no CPU.
"""

import os
import sys
from pathlib import Path

import psutil
import pytest

from slime.backends.engine import EngineClient, EngineRouter, create_engine_actor
from slime.model.tiny import build_tiny_model
from slime.ray.placement import actor_options, create_placement_group, plan_layout
from slime.utils.external_utils.ray_head import DASHBOARD_LIMITS, private_head

NUM_GPUS = 0

ROOT = Path(__file__).resolve().parents[1]
CI_ENV = {"SLIME_CI_DEVICE": "cpu", "SLIME_CI_EMULATE_GPUS": "1",
          "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

pytestmark = pytest.mark.slow  # a Ray head and its actors: about a minute on a busy 2-core machine


class Probe:
    def where(self):
        import ray

        return {"gpus": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid(),
                "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "limits": {name: os.environ.get(name) for name in DASHBOARD_LIMITS}}


def _running(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """The module's head, with a driver connected; afterwards no process of it, and none of
    the actors' workers the tests name in `spawned`, is left."""
    import ray

    tmp = tmp_path_factory.mktemp("head")
    env = {**os.environ, **CI_ENV, "TMPDIR": str(tmp), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("SLIME_CI_PORT_BASE", None)
    record, spawned = [], set()
    with private_head(num_gpus=4, env=env, record=record) as started:
        ray.init(address=started.gcs_address, runtime_env={"env_vars": CI_ENV}, log_to_driver=False)
        try:
            yield spawned
        finally:
            ray.shutdown()
    assert record
    left = [pid for pid in record[0].pids | spawned if _running(pid)]
    assert left == [], "a process of the head or an actor outlived it"


def test_actors_land_on_their_bundles(head):
    import ray
    from ray.util.placement_group import remove_placement_group

    # The head and everything it starts stay on loopback.
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.2"}
    assert ray.cluster_resources().get("GPU") == 4
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
    head.update(x["pid"] for x in (*r, *e, *w))
    # The head's processes (its workers inherit them) have Ray's dashboard start-up limits
    # raised to the head's own start-up budget (300 s by default).
    assert r[0]["limits"] == dict.fromkeys(DASHBOARD_LIMITS, "300"), r[0]["limits"]
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
    remove_placement_group(pg)


def test_engine_actors_hold_their_bundles_and_serve(head, tmp_path):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    model = build_tiny_model(tmp_path / "model", seed=0)
    pg = placement_group([{"GPU": 1}, {"GPU": 1}], strategy="PACK")
    ray.get(pg.ready(), timeout=120)
    actors = [create_engine_actor(str(model), num_gpus=1, seed=i, placement_group=pg, bundle_index=i)
              for i in range(2)]
    urls = ray.get([a.start.remote() for a in actors], timeout=300)
    infos = ray.get([a.info.remote() for a in actors], timeout=60)
    pids = {info["pid"] for info in infos}
    head.update(pids)
    assert len(pids) == 2 and os.getpid() not in pids
    gpus = [g for info in infos for g in info["gpu_ids"]]
    assert len(set(gpus)) == 2 and set(gpus) <= {0, 1, 2, 3}, gpus
    assert all(len(info["gpu_ids"]) == 1 and info["device"] == "cpu" for info in infos)
    assert [info["url"] for info in infos] == urls
    # The engines hold no CPU: the head's CPUs are all still free.
    assert ray.available_resources().get("CPU") == ray.cluster_resources().get("CPU")

    router = EngineRouter(urls)
    outs = [router.generate([1, 7, 14, 8, 16], {"max_new_tokens": 3, "sampling_seed": 1}) for _ in range(4)]
    assert len({tuple(o["output_ids"]) for o in outs}) == 1  # same seed, same tokens on either engine
    assert router.routed == [2, 2]
    router.update_weights_from_disk(str(model), weight_version="1")
    assert router.weight_versions() == {urls[0]: "1", urls[1]: "1"}
    server = EngineClient(urls[0]).server_info()
    assert server["pid"] == infos[0]["pid"] and server["gpu_ids"] == infos[0]["gpu_ids"]

    ray.get([a.stop.remote() for a in actors], timeout=60)
    assert not EngineClient(urls[0], timeout=5).is_healthy()
    for a in actors:
        ray.kill(a)
    remove_placement_group(pg)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
