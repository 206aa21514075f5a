"""GrpcRelay at shutdown: a backend stream ended by the proxy answers
UNAVAILABLE; a handler that is itself cancelled stays cancelled."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from runtimeproxy.cripath.forward import GrpcRelay


class Aborted(Exception):
    pass


class FakeContext:
    def __init__(self) -> None:
        self.aborted: list[grpc.StatusCode] = []

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def time_remaining(self) -> None:
        return None

    def cancelled(self) -> bool:
        return False

    async def send_initial_metadata(self, metadata: object) -> None:
        pass

    def set_trailing_metadata(self, metadata: object) -> None:
        pass

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted.append(code)
        raise Aborted(code)


class HangingCall:
    """A backend stream that sends nothing; grpc.aio raises CancelledError
    from a call cancelled locally, which ``wakes_on_cancel`` imitates."""

    def __init__(self, wakes_on_cancel: bool) -> None:
        self.wakes_on_cancel = wakes_on_cancel
        self.reading = asyncio.Event()
        self._cancelled = asyncio.Event()

    async def initial_metadata(self) -> tuple[()]:
        return ()

    async def trailing_metadata(self) -> tuple[()]:
        return ()

    def cancel(self) -> bool:
        if self.wakes_on_cancel:
            self._cancelled.set()
        return True

    def __aiter__(self) -> HangingCall:
        return self

    async def __anext__(self) -> bytes:
        self.reading.set()
        await self._cancelled.wait()
        raise asyncio.CancelledError()


class FakeChannel:
    def __init__(self, call: HangingCall) -> None:
        self.call = call

    def unary_stream(self, path: str):  # type: ignore[no-untyped-def]
        return lambda request, metadata, timeout: self.call


async def relay_in_task(call: HangingCall, context: FakeContext) -> tuple[GrpcRelay, asyncio.Task[list[bytes]]]:
    relay = GrpcRelay()

    async def handler() -> list[bytes]:
        channel = FakeChannel(call)
        return [m async for m in relay.server_stream(channel, "/x/Y", b"", context)]  # type: ignore[arg-type]

    task = asyncio.create_task(handler())
    await asyncio.wait_for(call.reading.wait(), 5)
    return relay, task


async def test_a_stream_ended_by_shutdown_answers_unavailable() -> None:
    call, context = HangingCall(wakes_on_cancel=True), FakeContext()
    relay, task = await relay_in_task(call, context)
    relay.end_streams()
    with pytest.raises(Aborted):
        await task
    assert context.aborted == [grpc.StatusCode.UNAVAILABLE]


async def test_a_cancelled_handler_during_shutdown_stays_cancelled() -> None:
    call, context = HangingCall(wakes_on_cancel=False), FakeContext()
    relay, task = await relay_in_task(call, context)
    relay.end_streams()  # shutdown has begun...
    task.cancel()  # ...and grpc cancels this handler (its client left, or the grace period ran out)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert context.aborted == []
