"""The proxy's HTTP/2 hook client under pressure: windows that shrink, servers
that stop reading or flood, callers that give up, connections that go away."""

from __future__ import annotations

import asyncio
import logging
import struct
from pathlib import Path

import grpc
import pytest

from runtimeproxy.frames.frame import ErrorCode, Flag, FrameType, Setting
from runtimeproxy.hookclient.pool import FramesTransport
from runtimeproxy.hookclient.transport import CallFailed

from .h2server import METHOD, Peer, answering, call, failed, serving


async def test_a_window_lowered_below_zero_mid_upload_sends_nothing_until_it_is_positive(sock: Path) -> None:
    """RFC 9113 section 6.9.2: a smaller INITIAL_WINDOW_SIZE can take an open
    stream's window below 0; the client then waits for WINDOW_UPDATEs."""
    message = b"m" * 100_000
    lowered = asyncio.Event()

    async def lowers(peer: Peer) -> None:
        await peer.handshake()
        peer.send(FrameType.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20))  # the connection does not bound it
        first = await peer.call()
        peer.answer(first.stream_id, b"warm")
        # The next call sends 65535 bytes (the default window), then waits.
        sent = 0
        while sent < 65_535:
            kind, _, sid, payload = await peer.frame()
            if kind == FrameType.DATA:
                sent += len(payload)
        peer.send(FrameType.SETTINGS, 0, 0, struct.pack(">HI", Setting.INITIAL_WINDOW_SIZE, 1000))
        await peer.until(FrameType.SETTINGS)  # the ACK: the client has applied it
        lowered.set()
        before = len(peer.seen)
        # Window now 1000 - 65535 < 0; 64535 + 100 more makes it 100.
        peer.send(FrameType.WINDOW_UPDATE, 0, 3, struct.pack(">I", 64_635))
        _, _, sid, payload = await peer.until(FrameType.DATA)
        assert sid == 3 and len(payload) == 100 and all(k != FrameType.DATA for k, _, _, _ in peer.seen[before:-1])
        total = sent + len(payload)
        while total < len(message) + 5:
            peer.send(FrameType.WINDOW_UPDATE, 0, 3, struct.pack(">I", 10_000))
            _, _, sid, payload = await peer.until(FrameType.DATA)
            assert sid == 3 and len(payload) <= 10_000
            total += len(payload)
        peer.answer(3, b"done")

    transport = FramesTransport()
    async with serving(sock, lowers):
        assert await call(transport, sock) == b"warm"
        assert await call(transport, sock, message) == b"done"
        assert lowered.is_set()
    await transport.close(1)


async def test_close_is_bounded_when_the_server_stops_reading(sock: Path) -> None:
    """A server that grants a large window and then reads nothing leaves our
    write buffer full: close(grace) still returns within the grace and a second."""
    async def stops_reading(peer: Peer) -> None:
        await peer.handshake({Setting.INITIAL_WINDOW_SIZE: fr_max_window()})
        peer.send(FrameType.WINDOW_UPDATE, 0, 0, struct.pack(">I", fr_max_window() - 65_535))
        await asyncio.Event().wait()  # never reads again; cancelled when the test ends

    transport = FramesTransport()
    async with serving(sock, stops_reading):
        with pytest.raises(CallFailed):
            await call(transport, sock, b"u" * (15 << 20), timeout=0.5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(transport.close(0.2), 5)
        assert loop.time() - started < 2.0


def fr_max_window() -> int:
    return (1 << 31) - 1


async def test_a_cancelled_caller_resets_its_stream_and_the_connection_goes_on(sock: Path) -> None:
    reset = asyncio.Event()
    asked = asyncio.Event()

    async def late(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        asked.set()
        _, _, sid, payload = await peer.until(FrameType.RST_STREAM)
        assert sid == got.stream_id and int.from_bytes(payload, "big") == ErrorCode.CANCEL
        reset.set()
        # Answered anyway, after the reset: its header block still changes the
        # client's HPACK table (a literal with indexing), which must stay in step.
        peer.answer_headers(got.stream_id, [("x-table", "grows")])
        peer.trailers(got.stream_id)
        second = await peer.call()
        peer.answer_headers(second.stream_id, [("x-table", "grows")])
        peer.send(FrameType.DATA, 0, second.stream_id, struct.pack(">BI", 0, 2) + b"ok")
        peer.trailers(second.stream_id)

    transport = FramesTransport()
    async with serving(sock, late):
        task = asyncio.create_task(call(transport, sock))
        await asyncio.wait_for(asked.wait(), 5)  # the request reached the server; its reset is what is awaited
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(reset.wait(), 5)
        assert await call(transport, sock) == b"ok"
    await transport.close(1)


async def test_a_graceful_goaway_lets_the_call_finish_then_the_next_goes_on_a_new_connection(sock: Path) -> None:
    async def drains(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        peer.send(FrameType.GOAWAY, 0, 0, struct.pack(">II", got.stream_id, ErrorCode.NO_ERROR))
        peer.answer(got.stream_id, b"finished here")
        await peer.reader.read()  # the client closes it once the call is over

    transport = FramesTransport()
    async with serving(sock, drains, answering(b"new connection")) as peers:
        assert await call(transport, sock) == b"finished here"
        await asyncio.wait_for(peers[0].finished.wait(), 5)  # closed by the client
        assert await call(transport, sock) == b"new connection"
        assert len(peers) == 2
    await transport.close(1)


@pytest.mark.parametrize("header", [":status", "grpc-status"])
async def test_absurd_status_digits_fail_the_call_not_the_loop(
    sock: Path, header: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def absurd(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        pairs = [(":status", "2" * 5000)] if header == ":status" else [
            (":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "1" * 5000)]
        peer.send(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, got.stream_id, peer.encoder.encode(pairs))

    transport = FramesTransport()
    async with serving(sock, absurd):
        err = await failed(transport, sock)
        assert err.code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN) and len(err.details) < 200
    await transport.close(1)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_smaller_header_table_is_acknowledged_in_the_next_block(sock: Path) -> None:
    async def strict(peer: Peer) -> None:
        await peer.handshake({Setting.HEADER_TABLE_SIZE: 0})
        first = await peer.call()
        peer.answer(first.stream_id, b"one")
        peer.decoder.max_allowed_table_size = 0  # now applied: a block must say so first
        second = await peer.call()
        assert second.headers[":path"] == METHOD
        peer.answer(second.stream_id, b"two")

    transport = FramesTransport()
    async with serving(sock, strict) as peers:
        assert await call(transport, sock) == b"one"
        assert await call(transport, sock) == b"two"
        blocks = [p for kind, _, sid, p in peers[0].seen if kind == FrameType.HEADERS]
        assert blocks[1][:1] == b"\x20" and blocks[0][:1] != b"\x20"
    await transport.close(1)


async def test_keep_only_lets_a_call_under_way_finish_then_closes(sock: Path) -> None:
    received = asyncio.Event()
    answer = asyncio.Event()

    async def slow(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        received.set()
        await answer.wait()
        peer.answer(got.stream_id, b"late but fine")
        await peer.reader.read()

    transport = FramesTransport()
    async with serving(sock, slow) as peers:
        pending = asyncio.create_task(call(transport, sock, timeout=10))
        await asyncio.wait_for(received.wait(), 5)
        transport.keep_only((), grace=10)
        assert transport.endpoints() == frozenset()
        answer.set()
        assert await pending == b"late but fine"
        await asyncio.wait_for(peers[0].finished.wait(), 5)  # then the client closed it
        with pytest.raises(CallFailed) as err:  # removed: not connected again
            await call(transport, sock)
        assert err.value.code == grpc.StatusCode.CANCELLED
    await transport.close(1)


async def test_a_ping_flood_while_we_cannot_write_is_cut_off(sock: Path) -> None:
    async def floods(peer: Peer) -> None:
        await peer.handshake({Setting.INITIAL_WINDOW_SIZE: fr_max_window()})
        peer.send(FrameType.WINDOW_UPDATE, 0, 0, struct.pack(">I", fr_max_window() - 65_535))
        await peer.writer.drain()
        await asyncio.sleep(0.2)  # the client's upload fills its buffer meanwhile: nothing to await from here
        for _ in range(1500):
            peer.send(FrameType.PING, 0, 0, b"12345678")
        await peer.writer.drain()
        await asyncio.Event().wait()

    transport = FramesTransport()
    async with serving(sock, floods):
        with pytest.raises(CallFailed) as raised:
            await call(transport, sock, b"u" * (15 << 20), timeout=5)
        err = raised.value
        assert err.code == grpc.StatusCode.UNAVAILABLE and "ENHANCE_YOUR_CALM" in err.details
    await transport.close(1)
