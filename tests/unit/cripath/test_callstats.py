"""The code a measured call is counted with, for each way its handler ends
(the grpc data path's metrics; a real server is in tests/component/ops)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc._cython import cygrpc

from runtimeproxy.cripath.callstats import measured
from runtimeproxy.cripath.methods import parse_method

REF = parse_method("/runtime.v1.RuntimeService/ContainerStatus")


class Sink:
    def __init__(self) -> None:
        self.active = 0
        self.codes: list[str] = []

    def started(self) -> None:
        self.active += 1

    def recorder(self, method: str, version: str) -> Callable[[str, float], None]:
        assert (method, version) == ("ContainerStatus", "v1")

        def record(code: str, seconds: float) -> None:
            self.active -= 1
            self.codes.append(code)

        return record


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
    sink = Sink()
    handler = measured(grpc.unary_unary_rpc_method_handler(_unary_ending(raised)), REF, sink)
    call = handler.unary_unary(b"", Context(context_code))
    if raised is None:
        assert await call == b"ok"
    else:
        with pytest.raises(type(raised)):
            await call
    assert (sink.codes, sink.active) == ([counted], 0)


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

    sink = Sink()
    stream = measured(grpc.unary_stream_rpc_method_handler(handler), REF, sink).unary_stream(b"", Context())
    got: list[bytes] = []
    if raised is None:
        got = [m async for m in stream]
    else:
        with pytest.raises(type(raised)):
            async for m in stream:
                got.append(m)
    assert (got, sink.codes, sink.active) == ([b"one"], [counted], 0)
