"""Percentiles and small summaries (no numpy needed)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (0 <= q <= 100) of an already sorted sequence."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo]) * (1 - frac) + float(sorted_values[hi]) * frac


def summarize(values: Iterable[float]) -> dict[str, float]:
    """n, mean, p50, p90, p99, min, max of a sample."""
    data = sorted(values)
    if not data:
        nan = math.nan
        return {"n": 0, "mean": nan, "p50": nan, "p90": nan, "p99": nan, "min": nan, "max": nan}
    return {
        "n": len(data),
        "mean": sum(data) / len(data),
        "p50": percentile(data, 50),
        "p90": percentile(data, 90),
        "p99": percentile(data, 99),
        "min": float(data[0]),
        "max": float(data[-1]),
    }


def ratio(a: float, b: float) -> float:
    """a / b, NaN when either is missing or b is 0."""
    if b == 0 or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b


def median(values: Iterable[float]) -> float:
    return percentile(sorted(values), 50)


def median_interval(values: Sequence[float], level: float = 0.9, resamples: int = 2000) -> tuple[float, float]:
    """A bootstrap interval for the median of ``values`` (percentile method, a fixed
    seed: the same sample always gives the same interval). NaNs when empty."""
    if not values:
        return math.nan, math.nan
    draw = random.Random(0)
    n = len(values)
    medians = sorted(median(draw.choices(values, k=n)) for _ in range(resamples))
    tail = (1 - level) / 2 * 100
    return percentile(medians, tail), percentile(medians, 100 - tail)


def correlation(a: Sequence[float], b: Sequence[float]) -> float:
    """Pearson's r of two equally long samples; NaN when either does not vary."""
    n = len(a)
    if n != len(b) or n < 2:
        return math.nan
    ma, mb = sum(a) / n, sum(b) / n
    sab = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    saa = sum((x - ma) ** 2 for x in a)
    sbb = sum((y - mb) ** 2 for y in b)
    return sab / math.sqrt(saa * sbb) if saa > 0 and sbb > 0 else math.nan
