"""The event loop's metric families expose what prometheus-client's own would."""

from __future__ import annotations

import re
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from runtimeproxy.loopmetrics import CounterFamily, HistogramFamily
from runtimeproxy.metrics import Metrics

BUCKETS = (0.001, 0.5, 1, 2)
# Exactly on a bound, below the first, between, past the last: buckets count values <= their bound.
VALUES = (0.0005, 0.001, 0.3, 1.0, 1.5, 2, 3, 100)


def _without_created(text: str) -> str:
    return re.sub(r"_created(\{[^}]*\})? \S+", "_created T", text)


@pytest.mark.parametrize("generate", [generate_latest, generate_openmetrics])
def test_the_exposition_is_prometheus_clients(generate) -> None:  # type: ignore[no-untyped-def]
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    counters = (Counter("x_calls", "calls", ["a", "b"], registry=theirs), CounterFamily("x_calls", "calls", ["a", "b"], ours))
    histograms = (
        Histogram("x_seconds", "time", ["a"], buckets=BUCKETS, registry=theirs),
        HistogramFamily("x_seconds", "time", ["a"], ours, buckets=BUCKETS),
    )
    for counter in counters:
        counter.labels("p", "q").inc()
        counter.labels("p", "q").inc(2.5)
        counter.labels("r", "s").inc()
    for histogram in histograms:
        for value in VALUES:
            histogram.labels("p").observe(value)
        histogram.labels("empty")
    assert _without_created(generate(ours).decode()) == _without_created(generate(theirs).decode())
    assert 'x_seconds_bucket{a="p",le="1.0"} 4.0' in generate_latest(ours).decode()


def test_created_series_follow_prometheus_clients_switch() -> None:
    from prometheus_client import disable_created_metrics, enable_created_metrics

    theirs, ours = CollectorRegistry(), CollectorRegistry()
    Counter("v_calls", "c", ["a"], registry=theirs).labels("x").inc()
    Histogram("v_s", "h", ["a"], registry=theirs).labels("x").observe(1)
    CounterFamily("v_calls", "c", ["a"], ours).labels("x").inc()
    # prometheus-client's own buckets, +Inf included, are taken as it takes them.
    HistogramFamily("v_s", "h", ["a"], ours, buckets=Histogram.DEFAULT_BUCKETS).labels("x").observe(1)
    disable_created_metrics()
    try:
        assert "_created" not in generate_latest(ours).decode()
        assert generate_latest(ours) == generate_latest(theirs)
    finally:
        enable_created_metrics()
    assert "v_s_created" in generate_latest(ours).decode()


def test_a_child_is_made_once_and_label_values_are_counted() -> None:
    family = CounterFamily("y_calls", "calls", ["a", "b"], CollectorRegistry())
    assert family.labels("p", "q") is family.labels("p", "q")
    with pytest.raises(ValueError, match="2 label values expected"):
        family.labels("p")
    with pytest.raises(ValueError, match="sorted"):
        HistogramFamily("z", "z", [], CollectorRegistry(), buckets=(2, 1))


def test_the_proxys_metrics_are_registered_once_under_their_names() -> None:
    metrics = Metrics()
    metrics.hook_call("noop", "PreCreateContainer", "ok", 0.0007)
    metrics.hooked_call("CreateContainer", "ok", 0.004)
    text = generate_latest(metrics.registry).decode()
    assert 'runtime_proxy_hook_calls_total{hook="PreCreateContainer",outcome="ok",server="noop"} 1.0' in text
    assert 'runtime_proxy_hook_duration_seconds_bucket{hook="PreCreateContainer",le="0.001"} 1.0' in text
    assert 'runtime_proxy_hooked_call_duration_seconds_bucket{le="0.005",method="CreateContainer"} 1.0' in text
    assert metrics.hook_stats["noop"].calls == {"ok": 1}


def test_a_scrape_while_the_loop_adds_series_sees_whole_numbers() -> None:
    """prometheus-client scrapes from its own thread while the loop's thread writes."""
    registry = CollectorRegistry()
    counter = CounterFamily("w_calls", "calls", ["n"], registry)
    histogram = HistogramFamily("w_seconds", "time", ["n"], registry, buckets=BUCKETS)
    done = threading.Event()
    errors: list[BaseException] = []

    def scrape() -> None:
        try:
            while not done.is_set():
                generate_latest(registry)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for n in range(20_000):
            counter.labels(str(n % 3000)).inc()
            histogram.labels(str(n % 3000)).observe(n / 10_000)
    finally:
        done.set()
        scraper.join()
    assert errors == []
    text = generate_latest(registry).decode()
    assert text.count("w_calls_total{") == 3000
    assert 'w_seconds_count{n="0"} 7.0' in text  # n = 0, 3000, ..., 18000
