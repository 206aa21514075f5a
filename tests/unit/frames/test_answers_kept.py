"""Answers the runtime gave whole are written before a connection ends: at
shutdown (the drain waits for the client's window) and when the runtime
closes its connection (what waits for the window, or behind a hooked call's
gate, still goes). And an end of the proxy's is a whole gRPC answer when the
runtime's began but had not reached the client."""

from __future__ import annotations

import asyncio
import gc
import struct
import weakref

import hpack

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import FrameConnection, Limits
from runtimeproxy.frames.frame import Flag, FrameType
from tests.frameroutes import Routes

from .test_connection import _pass_on, _Transport, _turns, _written_frames

HOOKED, RELAYED = "/runtime.v1.RuntimeService/StartContainer", "/runtime.v1.RuntimeService/ListContainers"
HEAD = [(":status", "200"), ("content-type", "application/grpc")]
HEAD_RAW = [(k.encode(), v.encode()) for k, v in HEAD]
BODY = struct.pack(">BI", 0, 100_000) + b"x" * 100_000  # over a client's first connection window (65,535)


def _mixed(unary: bool = True) -> Routes:
    """Calls on RELAYED pass verbatim; HOOKED ones are hooked in place."""
    return Routes(relayed=lambda path: path == RELAYED, stages=(_pass_on,), unary=unary)


def _connection() -> tuple[FrameConnection, _Transport]:
    client, backend = _Transport(), _Transport()
    conn = FrameConnection(client, backend, _mixed(), None, Limits(max_message=1 << 22))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    return conn, client


def _request(encoder: hpack.Encoder, sid: int, path: str = RELAYED) -> bytes:
    block = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                            ("content-type", "application/grpc"), ("te", "trailers")])
    return fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, block) + fr.serialize(FrameType.DATA, Flag.END_STREAM, sid, b"\0" * 5)


def _answer(encoder: hpack.Encoder, sid: int, body: bytes = BODY) -> bytes:
    return (fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, encoder.encode(HEAD))
            + b"".join(fr.data_frames(sid, body, 16384, False))
            + fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, sid, encoder.encode([("grpc-status", "0")])))


def _received(client: _Transport, sid: int) -> tuple[int, bool]:
    """DATA bytes the client got on ``sid``, and whether the stream ended there."""
    frames = [f for f in _written_frames(client) if f.stream_id == sid]
    return sum(len(f.payload) for f in frames if f.type == FrameType.DATA), any(f.has(Flag.END_STREAM) for f in frames)


async def test_a_stopping_connection_is_idle_only_once_its_answers_are_written() -> None:
    conn, client = _connection()
    conn.client_data(_request(hpack.Encoder(), 1))
    conn.begin_stop()
    conn.backend_data(_answer(hpack.Encoder(), 1))
    await _turns()
    assert 1 not in conn.unary_open and not conn.is_idle  # answered at the proxy, not at the client
    conn.client_data(fr.window_update(0, 1 << 20))
    assert conn.is_idle and _received(client, 1) == (len(BODY), True)


async def test_an_answer_waiting_for_the_window_goes_after_the_runtime_closed() -> None:
    conn, client = _connection()
    conn.client_data(_request(hpack.Encoder(), 1))
    conn.backend_data(_answer(hpack.Encoder(), 1))
    conn.backend_gone()  # the runtime answered in full, then closed (a restart)
    assert not conn.closed.done()
    conn.client_data(fr.window_update(0, 1 << 20))
    assert _received(client, 1) == (len(BODY), True)
    assert conn.closed.done() and client.closed


async def test_a_client_that_reads_none_of_them_is_closed_in_the_end(monkeypatch) -> None:
    monkeypatch.setattr("runtimeproxy.frames.runtimegone.UNREAD_LINGER_S", 0.05)
    conn, client = _connection()
    conn.client_data(_request(hpack.Encoder(), 1))
    conn.backend_data(_answer(hpack.Encoder(), 1))
    conn.backend_gone()
    assert not conn.closed.done()
    await asyncio.wait_for(conn.closed, 5)
    assert client.closed and _received(client, 1)[1] is False


async def test_an_answer_behind_a_hooked_calls_gate_goes_after_the_runtime_closed() -> None:
    conn, client = _connection()
    requests, answers = hpack.Encoder(), hpack.Encoder()
    conn.client_data(_request(requests, 1, HOOKED) + _request(requests, 3))
    await _turns()
    # The hooked call's answer began (its gate holds what follows); the relayed one came whole.
    conn.backend_data(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, answers.encode(HEAD))
                      + fr.serialize(FrameType.DATA, 0, 1, struct.pack(">BI", 0, 10) + b"abc"))
    conn.backend_data(_answer(answers, 3, b"\0" * 5))
    assert _received(client, 3) == (0, False)
    conn.backend_gone()
    await _turns()
    assert _received(client, 3) == (5, True)
    assert _received(client, 1)[1]  # the hooked call ends UNAVAILABLE
    assert conn.closed.done() and client.closed


def _blocks(client: _Transport) -> list[tuple[int, bool, dict[bytes, bytes]]]:
    """Header blocks as the client decodes them: (stream, END_STREAM, headers)."""
    decoder, out, block = hpack.Decoder(), [], None
    for f in _written_frames(client):
        if f.type == FrameType.HEADERS:
            block = [f.stream_id, f.has(Flag.END_STREAM), bytes(f.payload)]
        elif f.type == FrameType.CONTINUATION:
            block[2] += bytes(f.payload)
        else:
            continue
        if f.has(Flag.END_HEADERS):
            out.append((block[0], block[1], dict(decoder.decode(block[2], raw=True))))
    return out


async def test_a_stop_between_the_runtimes_headers_and_continuation_ends_the_call_whole() -> None:
    client, backend = _Transport(), _Transport()  # a stream: ended at once when the proxy stops
    conn = FrameConnection(client, backend, _mixed(unary=False), None, Limits(max_message=1 << 20))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.client_data(_request(hpack.Encoder(), 1))
    head = hpack.Encoder().encode(HEAD)
    conn.backend_data(fr.serialize(FrameType.HEADERS, 0, 1, head[:2]))  # no END_HEADERS yet
    conn.begin_stop()
    conn.backend_data(fr.serialize(FrameType.CONTINUATION, Flag.END_HEADERS, 1, head[2:]))
    blocks = _blocks(client)
    ended = blocks[0]
    assert ended[:2] == (1, True) and ended[2][b":status"] == b"200" and ended[2][b"grpc-status"] == b"14"
    assert blocks[1][1:] == (False, dict(HEAD_RAW))  # decoded by the client, on a stream it has closed


async def test_a_hooked_call_that_ended_is_freed_as_it_ends_not_by_the_collector() -> None:
    """Its gate names it: were the pair left as a cycle, the call's task,
    events and futures would wait for the cyclic collector (a proxy's every
    hooked call made garbage for it before)."""
    conn, client = _connection()
    requests, answers = hpack.Encoder(), hpack.Encoder()
    collecting = gc.isenabled()
    gc.disable()
    try:
        conn.client_data(_request(requests, 1, HOOKED))
        call = weakref.ref(conn.hooked[1])
        await _turns()
        conn.backend_data(_answer(answers, 1, b"\0" * 5))
        await _turns()
        assert _received(client, 1) == (5, True) and 1 not in conn.hooked
        assert call() is None  # freed by its references' end alone
    finally:
        if collecting:
            gc.enable()
