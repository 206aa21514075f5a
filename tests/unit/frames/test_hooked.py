"""A hooked call's request on its way to the runtime (frames/hooked.py, staged.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from runtimeproxy.frames.hooked import Hooked
from runtimeproxy.frames.staged import BackendFailed, _request_complete, _send


class _Inbound:
    def __init__(self) -> None:
        self.sent: list[tuple[int, bytes, bool]] = []

    def data(self, sid: int, payload: bytes, end: bool) -> None:
        self.sent.append((sid, payload, end))


def _conn(max_frame: int = 16_384) -> SimpleNamespace:
    return SimpleNamespace(backend_frames=SimpleNamespace(send=max_frame), inbound=_Inbound())


async def test_the_request_is_framed_under_the_stream_window_and_the_answer_returned() -> None:
    conn = _conn(max_frame=4)
    call = Hooked(1, "/p", [], (), window=6)
    sending = asyncio.ensure_future(_send(conn, call, b"abcdef"))  # 11 bytes with its prefix
    await asyncio.sleep(0)
    assert [len(p) for _, p, _ in conn.inbound.sent] == [4, 2]  # the window is spent
    call.window += 100
    call.window_grew()
    for _ in range(10):  # the sender's next turns, no timer
        await asyncio.sleep(0)
    assert len(conn.inbound.sent) == 4
    call.reply += b"\x00\x00\x00\x00\x02ok"
    call.answer(0, "")
    assert await asyncio.wait_for(sending, 5) == b"ok"
    assert b"".join(p for _, p, _ in conn.inbound.sent) == b"\x00\x00\x00\x00\x06abcdef"
    assert [end for _, _, end in conn.inbound.sent] == [False, False, False, True]


async def test_a_stream_reset_while_the_request_waits_for_window_ends_the_send() -> None:
    conn = _conn()
    call = Hooked(1, "/p", [], (), window=0)  # the runtime's window is closed
    sending = asyncio.ensure_future(_send(conn, call, b"request"))
    await asyncio.sleep(0)
    call.answer(-1, "reset by the runtime")
    with pytest.raises(BackendFailed):
        await asyncio.wait_for(sending, 5)
    assert conn.inbound.sent == []


async def test_the_task_waits_for_the_request_end_and_stops_at_the_runtime_end() -> None:
    call = Hooked(1, "/p", [], (), window=100)
    waiting = asyncio.ensure_future(_request_complete(call))
    await asyncio.sleep(0)
    assert not waiting.done()
    call.end_request()  # the client's END_STREAM, in a later read
    assert await asyncio.wait_for(waiting, 5) is True

    cut = Hooked(3, "/p", [], (), window=100)
    waiting = asyncio.ensure_future(_request_complete(cut))
    await asyncio.sleep(0)
    cut.runtime_ended(-1, "reset by the runtime")
    assert await asyncio.wait_for(waiting, 5) is False
    assert cut.cut_short and cut.request_ended


@pytest.mark.parametrize(("headers", "expected"), [
    ([(b":path", b"/runtime.v1.RuntimeService/CreateContainer"), (b"te", b"trailers")], False),
    ([(b"grpc-encoding", b"identity")], False),
    ([(b":path", b"/p"), (b"grpc-encoding", b"gzip"), (b"grpc-timeout", b"1S")], True),
    ([(b"grpc-encoding", b"identity"), (b"grpc-encoding", b"gzip")], True),  # the last one counts, as in grpc
    ([(b"grpc-encoding", b"gzip"), (b"grpc-encoding", b"identity")], False),
    ([(b"grpc-accept-encoding", b"gzip")], False),
])
def test_a_request_is_compressed_when_its_last_grpc_encoding_is_not_identity(
        headers: list[tuple[bytes, bytes]], expected: bool) -> None:
    from runtimeproxy.frames.hooked import compressed

    assert compressed(headers) is expected
