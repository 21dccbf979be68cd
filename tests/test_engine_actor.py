"""Where an engine runs: the device it takes from the CI variables.

Engine actors on a real Ray head are checked in `test_ray_head.py`, which shares one head
with the placement check.
"""

import sys

import pytest

from slime.backends.engine import engine_device

NUM_GPUS = 0


def test_engine_device_follows_the_ci_variables():
    assert engine_device({"SLIME_CI_DEVICE": "cpu"}) == "cpu"
    assert engine_device({"SLIME_CI_EMULATE_GPUS": "1"}) == "cpu"
    assert engine_device({"SLIME_CI_DEVICE": "cuda"}) == "cuda"
    with pytest.raises(ValueError, match="SLIME_CI_DEVICE"):
        engine_device({"SLIME_CI_DEVICE": "tpu"})


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
