"""Metric reports on one rank and their merge."""

import math
import sys

import pytest

from slime.utils.metrics import Metric, MetricReport, aggregate

NUM_GPUS = 0


def test_mean_of_means_is_count_weighted():
    a, b = MetricReport(), MetricReport()
    a.add("len", 10.0, count=1)
    b.add("len", 40.0, count=3)
    assert aggregate([a, b]).results()["len"] == pytest.approx(32.5)


def test_repeated_adds_accumulate():
    r = MetricReport()
    for v in (1.0, 2.0, 6.0):
        r.add("x", v)
    r.add("n", 2.0, reduce="sum")
    r.add("n", 3.0, reduce="sum")
    r.add("hi", 1.0, reduce="max")
    r.add("hi", 7.0, reduce="max")
    r.add("lo", 1.0, reduce="min")
    r.add("lo", -7.0, reduce="min")
    assert r.results() == {"hi": 7.0, "lo": -7.0, "n": 5.0, "x": 3.0}


def test_empty_rank_does_not_drag_max_to_zero():
    empty = Metric(reduce="max", value=0.0, count=0)
    assert empty.merge(Metric(reduce="max", value=-3.0, count=1)).result == -3.0
    assert Metric(reduce="min", value=5.0, count=1).merge(Metric(reduce="min", value=0.0, count=0)).result == 5.0


def test_mean_of_nothing_is_nan():
    r = MetricReport()
    r.add("x", 0.0, count=0)
    assert math.isnan(r.results()["x"])


def test_mixing_reductions_is_an_error():
    r = MetricReport()
    r.add("x", 1.0)
    with pytest.raises(ValueError, match="cannot merge"):
        r.add("x", 1.0, reduce="max")


def test_merge_does_not_mutate_inputs():
    a, b = MetricReport(), MetricReport()
    a.add("x", 1.0)
    b.add("x", 3.0)
    merged = a.merge(b)
    assert a.results() == {"x": 1.0}
    assert merged.results() == {"x": 2.0}


def test_order_does_not_matter():
    reports = []
    for i in range(5):
        r = MetricReport()
        r.add("m", float(i * i), count=i + 1)
        r.add("s", float(i), reduce="sum")
        reports.append(r)
    forward = aggregate(reports).results()
    backward = aggregate(reversed(reports)).results()
    assert forward == pytest.approx(backward)


def test_negative_count_rejected():
    with pytest.raises(ValueError, match="count"):
        MetricReport().add("x", 1.0, count=-1)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
