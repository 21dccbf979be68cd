"""Engine actors on a real Ray head on loopback, with logical GPUs as under `--emulate-gpus`.

The head is private (own ports, own temp dir) and stopped by pid afterwards. Two engines sit
in a placement group of two one-GPU bundles: each reports the logical GPU Ray gave it, runs on
the CPU (`SLIME_CI_DEVICE=cpu`, `SLIME_CI_EMULATE_GPUS=1`), serves HTTP from its own process,
and asks for no CPU (the bundles hold GPUs only).
"""

import os
import sys
from pathlib import Path

import psutil
import pytest

from slime.backends.engine import EngineClient, EngineRouter, create_engine_actor, engine_device
from slime.model.tiny import build_tiny_model
from slime.utils.external_utils.ray_head import private_head

NUM_GPUS = 0

ROOT = Path(__file__).resolve().parents[1]


def test_engine_device_follows_the_ci_variables():
    assert engine_device({"SLIME_CI_DEVICE": "cpu"}) == "cpu"
    assert engine_device({"SLIME_CI_EMULATE_GPUS": "1"}) == "cpu"
    assert engine_device({"SLIME_CI_DEVICE": "cuda"}) == "cuda"
    with pytest.raises(ValueError, match="SLIME_CI_DEVICE"):
        engine_device({"SLIME_CI_DEVICE": "tpu"})


@pytest.mark.slow  # a Ray head and two engine processes: about a minute on a busy 2-core machine
def test_engine_actors_hold_their_bundles_and_serve(tmp_path):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    model = build_tiny_model(tmp_path / "model", seed=0)
    ci_env = {"SLIME_CI_DEVICE": "cpu", "SLIME_CI_EMULATE_GPUS": "1",
              "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env = {**os.environ, **ci_env, "TMPDIR": str(tmp_path)}
    record, pids = [], set()
    with private_head(num_gpus=2, env=env, record=record) as head:
        ray.init(address=head.gcs_address, runtime_env={"env_vars": ci_env}, log_to_driver=False)
        try:
            assert ray.cluster_resources().get("GPU") == 2
            pg = placement_group([{"GPU": 1}, {"GPU": 1}], strategy="PACK")
            ray.get(pg.ready(), timeout=120)
            actors = [create_engine_actor(str(model), num_gpus=1, seed=i, placement_group=pg, bundle_index=i)
                      for i in range(2)]
            urls = ray.get([a.start.remote() for a in actors], timeout=300)
            infos = ray.get([a.info.remote() for a in actors], timeout=60)
            pids = {info["pid"] for info in infos}
            assert len(pids) == 2 and os.getpid() not in pids
            assert sorted(g for info in infos for g in info["gpu_ids"]) == [0, 1]
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
        finally:
            ray.shutdown()
    # Every process of the head, and the engine actors' workers, are gone.
    assert record and len(pids) == 2
    alive = []
    for pid in record[0].pids | pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    assert alive == []


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
