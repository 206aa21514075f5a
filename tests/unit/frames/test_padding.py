"""Padding counts against flow control (RFC 9113, 6.1), and stream windows are
end to end: where the proxy passes a padded DATA frame on without its padding,
it gives that stream window back to the sender itself, or a long stream would
stall once the lost window adds up."""

from __future__ import annotations

import struct
from itertools import pairwise

import pytest

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import Flag, FrameType

from .test_connection import VERSION, _client_view, _Transport, _written_frames
from .test_relayed_frames import OK, _connection

PAD = 200


def _padded(sid: int, body: bytes) -> bytes:
    return fr.serialize(FrameType.DATA, Flag.PADDED, sid, bytes([PAD]) + body + b"\0" * PAD)


def _sent(transport: _Transport) -> list[fr.Frame]:
    written = b"".join(transport.written).removeprefix(fr.PREFACE)  # (the client's, passed to the runtime)
    frames, pos = [], 0
    while (parsed := fr.parse(written, pos, fr.MAX_FRAME_LIMIT))[0] is not None:
        frame, pos = parsed
        frames.append(frame)
    return frames


def _stream_updates(transport: _Transport, sid: int) -> list[int]:
    frames = _sent(transport)
    return [fr.window_increment(f) for f in frames if f.type == FrameType.WINDOW_UPDATE and f.stream_id == sid]


async def test_an_answers_padding_is_given_back_to_the_runtime() -> None:
    conn, client, _, to_backend, from_backend = _connection(max_message=1 << 20)
    backend = conn.backend._transport  # type: ignore[union-attr]  # noqa: SLF001 - what the runtime was sent
    head = fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, to_backend.encode(
        [(":method", "POST"), (":scheme", "http"), (":path", VERSION), (":authority", "x"),
         ("content-type", "application/grpc"), ("te", "trailers")]))
    conn.client_data(head + fr.serialize(FrameType.DATA, Flag.END_STREAM, 1, b"\0\0\0\0\0"))
    body = struct.pack(">BI", 0, 1000) + b"x" * 1000
    conn.backend_data(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, from_backend.encode(OK[:2]))
                      + _padded(1, body))
    got = b"".join(bytes(f.payload) for f in _written_frames(client) if f.type == FrameType.DATA)
    assert got == body  # the client has the message, unpadded
    assert _stream_updates(backend, 1) == [1 + PAD]  # and the runtime its window: pad length and padding


async def test_a_requests_padding_queued_for_the_runtime_is_given_back_to_the_client() -> None:
    conn, client, _, to_backend, _ = _connection(max_message=1 << 20)
    head = fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, to_backend.encode(
        [(":method", "POST"), (":scheme", "http"), (":path", VERSION), (":authority", "x"),
         ("content-type", "application/grpc"), ("te", "trailers")]))
    message = struct.pack(">BI", 0, 100_000) + b"x" * 99_995  # 100,000 bytes with its prefix
    fill = b"".join(fr.data_frames(1, message[:65_535], 16_384, False))  # the runtime's connection window, spent
    conn.client_data(head + fill + _padded(1, message[65_535:66_535]))
    assert _stream_updates(client, 1) == [1 + PAD]  # queued without its padding: that window comes back now


def _message_in_frames(sid: int, length: int, end: bool) -> bytes:
    """One message of ``length`` in DATA frames, padded and not in turn, its
    prefix split across the first two: the size check carries its state from
    the in-place read (feed_at) to the padded frame's (feed) and back."""
    message = struct.pack(">BI", 255, length) + b"m" * length
    cuts = [0, 3, 5, 40, len(message)]
    pieces = [message[a:b] for a, b in pairwise(cuts)]
    frames = [
        _padded(sid, piece) if i % 2 else fr.serialize(FrameType.DATA, 0, sid, piece) for i, piece in enumerate(pieces)
    ]
    if end:
        frames.append(fr.serialize(FrameType.DATA, Flag.END_STREAM, sid, b""))
    return b"".join(frames)


@pytest.mark.parametrize("direction", ["request", "answer"])
@pytest.mark.parametrize(("length", "code"), [(100, "OK"), (101, "RESOURCE_EXHAUSTED")])
async def test_a_message_in_padded_frames_is_held_to_the_size_limit(direction: str, length: int, code: str) -> None:
    conn, _, routes, to_backend, from_backend = _connection(max_message=100)
    head = fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, to_backend.encode(
        [(":method", "POST"), (":scheme", "http"), (":path", VERSION), (":authority", "x"),
         ("content-type", "application/grpc"), ("te", "trailers")]))
    request = _message_in_frames(1, length, True) if direction == "request" else _message_in_frames(1, 7, True)
    conn.client_data(head + request)
    answer = _message_in_frames(1, length if direction == "answer" else 7, False)
    conn.backend_data(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, from_backend.encode(OK[:2])) + answer
                      + fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, from_backend.encode(OK[2:])))
    assert [end for end, _ in routes.ends] == [code]


def _data_sent(transport: _Transport, sid: int) -> bytes:
    """What ``transport`` was written as DATA on ``sid``, padding taken off."""
    return b"".join(bytes(fr.unpadded(f)) for f in _sent(transport) if f.type == FrameType.DATA and f.stream_id == sid)


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("direction", ["request", "answer"])
@pytest.mark.parametrize(("length", "code"), [(0, "OK"), (100, "OK"), (101, "RESOURCE_EXHAUSTED")])
async def test_a_streams_first_data_frame_holding_one_whole_message_is_held_to_the_size_limit(
    padded: bool, direction: str, length: int, code: str
) -> None:
    """The first DATA frame of a stream that is exactly one message: the case
    in which no size tracker is made (msgsize.StreamSizes) if the message is
    within the limit, unpadded (read in place) or padded (read by feed)."""
    conn, client, routes, to_backend, from_backend = _connection(max_message=100)
    backend = conn.backend._transport  # type: ignore[union-attr]  # noqa: SLF001 - what the runtime was sent
    message = struct.pack(">BI", 0, length) + b"m" * length
    small = struct.pack(">BI", 0, 7) + b"s" * 7

    def first(body: bytes, end: bool) -> bytes:  # the stream's first DATA frame, the whole message
        if padded:
            flags = Flag.PADDED | (Flag.END_STREAM if end else 0)
            return fr.serialize(FrameType.DATA, flags, 1, bytes([PAD]) + body + b"\0" * PAD)
        return fr.serialize(FrameType.DATA, Flag.END_STREAM if end else 0, 1, body)

    head = fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, to_backend.encode(
        [(":method", "POST"), (":scheme", "http"), (":path", VERSION), (":authority", "x"),
         ("content-type", "application/grpc"), ("te", "trailers")]))
    request = message if direction == "request" else small
    conn.client_data(head + first(request, True))
    answer = message if direction == "answer" else small
    conn.backend_data(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, from_backend.encode(OK[:2]))
                      + first(answer, False)
                      + fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, from_backend.encode(OK[2:])))
    assert [end for end, _ in routes.ends] == [code]
    if code == "OK":  # relayed as sent: the runtime has the request, the client the answer
        assert _data_sent(backend, 1) == request
        assert _data_sent(client, 1) == answer
    else:  # ended by the proxy: nothing of the message over the limit goes on
        assert _data_sent(backend if direction == "request" else client, 1) == b""
        statuses = [hdrs[b"grpc-status"] for sid, _, hdrs in _client_view(client) if b"grpc-status" in hdrs]
        assert statuses[0] == b"8"  # the client's end (the runtime's blocks after it are stray: downstream._stray)
