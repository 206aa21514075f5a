"""The code a measured call is counted with, for each way its handler ends
(the grpc data path's metrics; a real server is in tests/component/ops)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc._cython import cygrpc
from prometheus_client import CollectorRegistry

from runtimeproxy.cripath.callstats import measured
from runtimeproxy.cripath.methods import metric_ref, parse_method
from runtimeproxy.metrics import CriCallMetrics

REF = parse_method("/runtime.v1.RuntimeService/ContainerStatus")


def counts(metrics: CriCallMetrics, registry: CollectorRegistry) -> tuple[dict[str, float], int]:
    """The ContainerStatus calls counted by code, and the calls still in flight."""
    codes = {
        sample.labels["code"]: sample.value
        for family in registry.collect()
        if family.name == "runtime_proxy_cri_calls"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels["method"] == "ContainerStatus"
    }
    return codes, metrics.active


class Context:
    """What the wrapper reads of a servicer context: the code abort() set."""

    def __init__(self, code: grpc.StatusCode | None = None) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode | None:
        return self._code


def _unary_ending(exc: BaseException | None) -> Callable[..., Any]:
    async def handler(request: bytes, context: Any) -> bytes:
        if exc is not None:
            raise exc
        return b"ok"

    return handler


@pytest.mark.parametrize(
    ("raised", "context_code", "counted"),
    [
        (None, None, "OK"),
        (aio.AbortError(), grpc.StatusCode.NOT_FOUND, "NOT_FOUND"),
        (asyncio.CancelledError(), None, "CANCELLED"),
        # abort() set the backend's code, but its send failed: the client had
        # left already (its deadline passed a moment earlier).
        (cygrpc.ExecuteBatchError("Failed execute_batch"), grpc.StatusCode.DEADLINE_EXCEEDED, "CANCELLED"),
        (RuntimeError("a bug"), None, "UNKNOWN"),
    ],
    ids=["ok", "aborted", "cancelled", "status-send-failed", "unexpected"],
)
async def test_unary_counted_with_how_it_ended(
    raised: BaseException | None, context_code: grpc.StatusCode | None, counted: str
) -> None:
    registry = CollectorRegistry()
    metrics = CriCallMetrics(registry)
    handler = measured(grpc.stream_unary_rpc_method_handler(_unary_ending(raised)), REF, metrics)
    call = handler.stream_unary(b"", Context(context_code))
    if raised is None:
        assert await call == b"ok"
    else:
        with pytest.raises(type(raised)):
            await call
    assert counts(metrics, registry) == ({counted: 1.0}, 0)


@pytest.mark.parametrize(
    ("raised", "counted"),
    [
        (None, "OK"),
        (cygrpc.ExecuteBatchError("Failed execute_batch"), "CANCELLED"),
        (RuntimeError("a bug"), "UNKNOWN"),
    ],
    ids=["ok", "status-send-failed", "unexpected"],
)
async def test_stream_counted_with_how_it_ended(raised: BaseException | None, counted: str) -> None:
    async def handler(request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield b"one"
        if raised is not None:
            raise raised

    registry = CollectorRegistry()
    metrics = CriCallMetrics(registry)
    stream = measured(grpc.stream_stream_rpc_method_handler(handler), REF, metrics).stream_stream(b"", Context())
    got: list[bytes] = []
    if raised is None:
        got = [m async for m in stream]
    else:
        with pytest.raises(type(raised)):
            async for m in stream:
                got.append(m)
    assert (got, counts(metrics, registry)) == ([b"one"], ({counted: 1.0}, 0))


def test_a_method_has_series_only_once_called() -> None:
    """The grpc path builds a recorder for every method of each routing table:
    none of them exports a series before its method is called (the recorder
    keeps the label children it looks up, from the first call on)."""
    registry = CollectorRegistry()
    metrics = CriCallMetrics(registry)
    assert REF is not None
    record = metrics.recorder(REF)

    def series() -> list[tuple[str, str]]:
        return [(sample.name, sample.labels.get("code", "")) for family in registry.collect()
                if family.name.startswith("runtime_proxy_cri_call") for sample in family.samples
                if sample.name.endswith(("_total", "_count"))]

    assert series() == []
    metrics.started()
    record("OK", 0.01)
    metrics.started()
    record("NOT_FOUND", 0.02)
    assert sorted(series()) == [("runtime_proxy_cri_call_duration_seconds_count", ""),
                                ("runtime_proxy_cri_calls_total", "NOT_FOUND"), ("runtime_proxy_cri_calls_total", "OK")]
    assert counts(metrics, registry) == ({"OK": 1.0, "NOT_FOUND": 1.0}, 0)


async def test_labels_stay_bounded_whatever_the_names() -> None:
    """A client can call any method name; the registry holds series only for
    the names our schemas have, the rest under ``unknown``."""
    registry = CollectorRegistry()
    metrics = CriCallMetrics(registry)
    for i in range(500):
        ref = parse_method(f"/runtime.v1.RuntimeService/Bogus{i}")
        assert ref is not None
        handler = measured(grpc.stream_unary_rpc_method_handler(_unary_ending(None)), ref, metrics)
        await handler.stream_unary(b"", Context())
        v1alpha2 = parse_method(f"/runtime.v1alpha2.ImageService/Bogus{i}")
        assert v1alpha2 is not None
        metrics.recorder(v1alpha2)("OK", 0.001)
    assert REF is not None
    metrics.recorder(REF)("OK", 0.001)
    labels = {
        (sample.labels["method"], sample.labels["version"])
        for family in registry.collect()
        if family.name == "runtime_proxy_cri_calls"
        for sample in family.samples
    }
    assert labels == {("unknown", "v1"), ("unknown", "v1alpha2"), ("ContainerStatus", "v1")}


def test_metric_ref_keeps_known_methods_only() -> None:
    known = parse_method("/runtime.v1alpha2.RuntimeService/CheckpointContainer")  # v1's, asked in v1alpha2
    assert known is not None and metric_ref(known) is known
    for path in ("/runtime.v1.RuntimeService/Bogus", "/runtime.v1.ImageService/RunPodSandbox"):
        ref = parse_method(path)
        assert ref is not None
        assert metric_ref(ref) == dataclasses.replace(ref, method="unknown")
