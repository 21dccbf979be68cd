"""Metric reports aggregated across a real gloo group: count-weighted means, sums, max, min."""

import math
import sys

import pytest
from _gloo import run_ranks

from slime.utils.metrics import MetricReport, aggregate, all_reduce_report

NUM_GPUS = 0
WORLD = 4


def local_report(rank):
    r = MetricReport()
    # Rank r saw r + 1 responses with mean length 10 * (r + 1).
    r.add("response_len/mean", 10.0 * (rank + 1), count=rank + 1)
    r.add("samples/total", float(rank + 1), reduce="sum")
    r.add("reward/max", float(rank % 3), reduce="max")
    r.add("logprob/min", -float(rank), reduce="min")
    if rank == 2:
        r.add("only_on_two", 5.0)  # a metric some ranks never see
    return r


def reduce_on_rank(rank, world_size):
    return all_reduce_report(local_report(rank)).results()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_ranks(reduce_on_rank, WORLD, tmp_path_factory.mktemp("gloo"))


def test_every_rank_gets_the_same_result(results):
    for r in results[1:]:
        assert r == results[0]


def test_means_are_count_weighted(results):
    # sum of (count * mean) / total count = (1*10 + 2*20 + 3*30 + 4*40) / 10 = 30
    assert results[0]["response_len/mean"] == pytest.approx(30.0)
    # Averaging the per-rank means would give 25: the bug this guards against.
    assert results[0]["response_len/mean"] != pytest.approx(25.0)


def test_sums_max_min(results):
    assert results[0]["samples/total"] == 10.0
    assert results[0]["reward/max"] == 2.0
    assert results[0]["logprob/min"] == -3.0


def test_metric_from_one_rank_is_not_diluted(results):
    assert results[0]["only_on_two"] == 5.0


def test_distributed_equals_local_aggregation(results):
    local = aggregate(local_report(r) for r in range(WORLD)).results()
    assert local.keys() == results[0].keys()
    for k, v in local.items():
        assert math.isclose(v, results[0][k])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
