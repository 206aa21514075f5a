"""Mux and ttrpc framing, byte by byte."""

from __future__ import annotations

import asyncio
import struct

import pytest

from cri_api.nri import api_pb2 as nri
from cri_api.ttrpc import request_pb2 as ttrpc_pb
from runtimeproxy.nri import ttrpc
from runtimeproxy.nri.mux import FIRST_FRAME_LIMIT, Mux, encode_frames, split_message
from runtimeproxy.nri.plugin import Identity, event_mask


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5])
def test_first_frame_is_at_most_4096_bytes_and_the_rest_follows(size: int) -> None:
    data = bytes(range(256)) * (size // 256 + 1)
    data = data[:size]
    chunks = split_message(data)
    assert b"".join(chunks) == data
    assert len(chunks[0]) == min(size, FIRST_FRAME_LIMIT)
    assert len(chunks) == (1 if size <= FIRST_FRAME_LIMIT else 2)  # as Go's mux: 4096, then the rest


def test_frame_bytes() -> None:
    assert encode_frames(2, b"abc") == b"\0\0\0\x02\0\0\0\x03abc"
    assert ttrpc.encode_frame(5, ttrpc.TYPE_RESPONSE, b"xy") == b"\0\0\0\x02\0\0\0\x05\x02\x00xy"


def test_event_mask_bits() -> None:
    assert event_mask([nri.RUN_POD_SANDBOX]) == 1
    assert event_mask([nri.CREATE_CONTAINER, nri.REMOVE_CONTAINER]) == (1 << 3) | (1 << 10)


@pytest.mark.parametrize("index", ["7", "100", "a1", ""])
def test_plugin_index_is_two_digits(index: str) -> None:
    with pytest.raises(ValueError, match="two digits"):
        Identity("p", index)


class _Sink:
    """A StreamWriter stand-in: what is written can be read back from ``out``."""

    def __init__(self) -> None:
        self.out = asyncio.StreamReader()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out.feed_data(data)

    async def frame(self) -> tuple[int, ttrpc.Frame]:
        """The next mux frame written, as (connection, ttrpc frame)."""
        conn, length = struct.unpack(">II", await self.out.readexactly(8))
        inner = asyncio.StreamReader()
        inner.feed_data(await self.out.readexactly(length))
        inner.feed_eof()
        frame = await ttrpc.read_frame(inner)
        assert frame is not None
        return conn, frame

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


async def test_mux_reassembles_a_stream_cut_anywhere() -> None:
    message = ttrpc.encode_frame(1, ttrpc.TYPE_REQUEST, b"payload-" * 10)
    for cut in range(1, len(message)):
        stream = encode_frames(1, message[:cut]) + encode_frames(1, message[cut:])
        reader = asyncio.StreamReader()
        mux = Mux(reader, _Sink())  # type: ignore[arg-type]
        conn = mux.open(1)
        run = asyncio.create_task(mux.run())
        for byte in stream:  # and the socket delivers it byte by byte
            reader.feed_data(bytes([byte]))
        reader.feed_eof()
        frame = await ttrpc.read_frame(conn.reader)
        assert frame == ttrpc.Frame(1, ttrpc.TYPE_REQUEST, 0, b"payload-" * 10)
        assert await ttrpc.read_frame(conn.reader) is None  # the socket's end is every connection's end
        await run


async def test_mux_refuses_a_frame_for_connection_zero() -> None:
    reader = asyncio.StreamReader()
    sink = _Sink()
    mux = Mux(reader, sink)  # type: ignore[arg-type]
    conn = mux.open(1)
    reader.feed_data(struct.pack(">II", 0, 1) + b"x")
    await mux.run()  # a peer that breaks the framing ends the socket
    assert sink.closed and mux.closed.is_set()
    assert await ttrpc.read_frame(conn.reader) is None


async def _pair() -> tuple[Mux, asyncio.StreamReader, _Sink]:
    reader, sink = asyncio.StreamReader(), _Sink()
    return Mux(reader, sink), reader, sink  # type: ignore[arg-type]


async def test_server_answers_with_payload_or_status() -> None:
    mux, reader, sink = await _pair()

    async def echo(payload: bytes) -> bytes:
        if payload == b"boom":
            raise ttrpc.TtrpcError(ttrpc.FAILED_PRECONDITION, "refused")
        return payload[::-1]

    server = ttrpc.Server(mux.open(1), {("svc", "Echo"): echo})
    tasks = [asyncio.create_task(mux.run()), asyncio.create_task(server.serve())]
    for stream, (method, payload) in enumerate([("Echo", b"abc"), ("Echo", b"boom"), ("Nope", b"")], start=0):
        body = ttrpc_pb.Request(service="svc", method=method, payload=payload).SerializeToString()
        reader.feed_data(encode_frames(1, ttrpc.encode_frame(2 * stream + 1, ttrpc.TYPE_REQUEST, body)))
    answers: dict[int, ttrpc_pb.Response] = {}
    for _ in range(3):  # in any order: each call is its own task
        conn, frame = await sink.frame()
        assert conn == 1 and frame.type == ttrpc.TYPE_RESPONSE
        answers[frame.stream_id] = ttrpc_pb.Response.FromString(frame.body)
    assert answers[1].payload == b"cba" and not answers[1].status.code
    assert (answers[3].status.code, answers[3].status.message) == (ttrpc.FAILED_PRECONDITION, "refused")
    assert answers[5].status.code == ttrpc.UNIMPLEMENTED
    reader.feed_eof()
    await asyncio.gather(*tasks)


async def test_client_call_status_timeout_and_closed_connection() -> None:
    mux, reader, sink = await _pair()
    client = ttrpc.Client(mux.open(2))
    tasks = [asyncio.create_task(mux.run()), asyncio.create_task(client.run())]
    with pytest.raises(ttrpc.TtrpcError) as timed_out:
        await client.call("svc", "M", nri.Empty(), nri.Empty, timeout=0.01)
    assert timed_out.value.code == ttrpc.DEADLINE_EXCEEDED
    conn, frame = await sink.frame()
    assert (conn, frame.stream_id, frame.type) == (2, 1, ttrpc.TYPE_REQUEST)
    request = ttrpc_pb.Request.FromString(frame.body)
    assert (request.service, request.method, request.timeout_nano) == ("svc", "M", 10_000_000)
    call = asyncio.create_task(client.call("svc", "M", nri.Empty(), nri.Empty, timeout=5))
    conn, frame = await sink.frame()
    assert frame.stream_id == 3  # client stream ids are odd
    status = ttrpc_pb.Response(status=ttrpc_pb.Status(code=ttrpc.UNAVAILABLE, message="later"))
    reader.feed_data(encode_frames(2, ttrpc.encode_frame(3, ttrpc.TYPE_RESPONSE, status.SerializeToString())))
    with pytest.raises(ttrpc.TtrpcError, match="later"):
        await call
    pending = asyncio.create_task(client.call("svc", "M", nri.Empty(), nri.Empty, timeout=5))
    await sink.frame()
    reader.feed_eof()
    with pytest.raises(ConnectionError):
        await pending
    await asyncio.gather(*tasks)


async def test_an_answer_over_the_ttrpc_limit_is_an_error_status_not_silence() -> None:
    reader, sink = asyncio.StreamReader(), _Sink()
    mux = Mux(reader, sink)

    async def big(payload: bytes) -> bytes:
        return b"x" * (ttrpc.MAX_BODY + 1)

    server = ttrpc.Server(mux.open(1), {("svc", "Big"): big})
    tasks = [asyncio.create_task(mux.run()), asyncio.create_task(server.serve())]
    body = ttrpc_pb.Request(service="svc", method="Big").SerializeToString()
    reader.feed_data(encode_frames(1, ttrpc.encode_frame(1, ttrpc.TYPE_REQUEST, body)))
    _, frame = await asyncio.wait_for(sink.frame(), 5)
    response = ttrpc_pb.Response.FromString(frame.body)
    assert (frame.stream_id, response.status.code) == (1, ttrpc.RESOURCE_EXHAUSTED)
    assert "runtime-proxy" in response.status.message
    reader.feed_eof()
    await asyncio.gather(*tasks)
