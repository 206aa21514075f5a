"""Counters and histograms updated on the event loop, exposed by prometheus-client.

prometheus-client's own metrics resolve their labels and take a lock on
every update: some 25 us each on the call path of a sparse call (a pod
lifecycle's, when the proxy wakes for it), several times per CRI call. These
families keep plain numbers, updated only by the thread that runs the event
loop, and hand them to prometheus-client when it is scraped (a custom
collector, read from its server thread). The exposition is the same as
prometheus-client's ``Counter`` and ``Histogram``, ``_created`` included. A
scrape may see an update half done (a histogram's count one ahead of its
sum), as with prometheus-client's own per-value locks; never a torn number.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence

import prometheus_client.metrics
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString


def _created_shown() -> bool:
    """prometheus-client's own switch (PROMETHEUS_DISABLE_CREATED_SERIES, or
    ``disable_created_metrics()``), which its metrics follow."""
    return getattr(prometheus_client.metrics, "_use_created", True)


class Count:
    """One labelled counter."""

    __slots__ = ("value", "created")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Observed:
    """One labelled histogram: a count per bucket (not yet cumulative) and the sum."""

    __slots__ = ("bounds", "counts", "sum", "created")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf's
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # buckets count values <= their bound
        self.sum += value


class _Family:
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        registry.register(self)  # type: ignore[arg-type]  # a Collector by duck type: the registry calls collect()

    def _check(self, values: tuple[str, ...]) -> None:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected, got {len(values)}")

    def describe(self) -> list[Metric]:
        return [self._family()]

    def _family(self) -> Metric:
        raise NotImplementedError


class CounterFamily(_Family):
    """A counter by labels: ``labels(...)`` is kept by callers that count often."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        super().__init__(name, documentation, labelnames, registry)
        self._children: dict[tuple[str, ...], Count] = {}

    def labels(self, *values: str) -> Count:
        child = self._children.get(values)
        if child is None:
            self._check(values)
            child = self._children[values] = Count()
        return child

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in self._children.copy().items():  # one step under the GIL: the loop may add a child
            family.add_metric(values, child.value, created=child.created if _created_shown() else None)
        yield family


class HistogramFamily(_Family):
    """A histogram by labels, with prometheus-client's bucket semantics (``le``, +Inf)."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry,
        buckets: Sequence[float],
    ) -> None:
        super().__init__(name, documentation, labelnames, registry)
        # +Inf is always the last bucket; a list that names it (prometheus-client's own) is taken too.
        self.bounds = tuple(float(b) for b in buckets if b != float("inf"))
        if list(self.bounds) != sorted(set(self.bounds)) or not self.bounds:
            raise ValueError(f"{name}: buckets must be distinct and sorted")
        self._names = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        self._children: dict[tuple[str, ...], Observed] = {}

    def labels(self, *values: str) -> Observed:
        child = self._children.get(values)
        if child is None:
            self._check(values)
            child = self._children[values] = Observed(self.bounds)
        return child

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in self._children.copy().items():
            counts, total = list(child.counts), child.sum
            cumulative, running = [], 0
            for bucket, count in zip(self._names, counts, strict=True):
                running += count
                cumulative.append((bucket, float(running)))
            family.add_metric(values, cumulative, total)
            if _created_shown():
                family.add_sample(f"{self.name}_created", dict(zip(self.labelnames, values, strict=True)), child.created)
        yield family
