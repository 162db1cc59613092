"""Percentiles and summaries for benchmark figures."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.loadgen.stats import Distribution, percentile, rate, summarize


def test_percentile_interpolates_between_ranks_like_numpy() -> None:
    """The 90th percentile of 1..10 is 9.1, numpy.percentile's default (linear) answer."""
    assert percentile([1.0, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90) == pytest.approx(9.1)


def test_percentile_of_nothing_is_nan() -> None:
    """No samples give NaN, not zero, so a missing figure is never mistaken for a fast one."""
    assert math.isnan(percentile([], 50))


def test_percentile_rejects_q_outside_0_to_100() -> None:
    """q is a percentage; 101 is a caller's error."""
    with pytest.raises(ValueError, match="101"):
        percentile([1.0], 101)


@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=1), st.floats(min_value=0, max_value=100))
def test_percentile_lies_between_min_and_max(values: list[float], q: float) -> None:
    """Any percentile lies within the range of the samples."""
    data = sorted(values)
    assert data[0] <= percentile(data, q) <= data[-1]


def test_summarize_scales_seconds_to_milliseconds() -> None:
    """summarize(values, 1000) reports count, mean and percentiles in milliseconds."""
    d = summarize([0.001, 0.002, 0.003], 1000.0)
    assert (d.count, d.mean, d.p50) == pytest.approx((3, 2.0, 2.0))


def test_empty_distribution_round_trips_through_json_as_none() -> None:
    """An empty summary serializes NaN as None (valid JSON) and reads back as NaN."""
    d = summarize([])
    back = Distribution.from_dict(d.to_dict())
    assert (d.to_dict()["p99"], back.count, math.isnan(back.p99)) == (None, 0, True)


def test_rate_is_zero_when_no_time_passed() -> None:
    """A rate over zero seconds is 0, not a division error."""
    assert rate(10, 0.0) == 0.0
