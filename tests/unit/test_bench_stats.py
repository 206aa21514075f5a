"""`bench/stats.py`: the figures the lifecycle verdicts rest on."""

from __future__ import annotations

import math

from bench.stats import correlation, median, median_interval


def test_the_median_interval_holds_the_median_and_narrows_with_more_samples() -> None:
    few = [1.00, 1.04, 0.98, 1.07, 1.02, 1.01, 0.97, 1.05, 1.03, 0.99]
    many = few * 9
    lo, hi = median_interval(few)
    assert lo <= median(few) <= hi
    assert lo >= min(few) and hi <= max(few)
    lo9, hi9 = median_interval(many)
    assert lo9 <= median(many) <= hi9
    assert hi9 - lo9 < hi - lo


def test_the_median_interval_is_the_same_for_the_same_sample() -> None:
    sample = [1.0, 1.1, 0.9, 1.05, 1.2, 0.95, 1.02]
    assert median_interval(sample) == median_interval(list(sample))


def test_the_median_interval_of_nothing_is_unknown() -> None:
    assert all(math.isnan(v) for v in median_interval([]))


def test_correlation_of_drifting_and_unrelated_samples() -> None:
    drift = [200.0, 240.0, 330.0, 260.0, 210.0]
    assert correlation(drift, [d * 1.04 + 3 for d in drift]) > 0.99
    assert correlation(drift, [-d for d in drift]) < -0.99
    assert abs(correlation([1.0, 2.0, 3.0, 4.0], [1.0, -1.0, -1.0, 1.0])) < 1e-9
    assert math.isnan(correlation([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert math.isnan(correlation([1.0], [2.0]))
