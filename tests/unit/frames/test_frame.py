"""HTTP/2 frame parsing and building, gRPC message-size tracking, the client's window queue."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import hpack
import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.divert import encode_headers, parse_timeout
from runtimeproxy.frames.messages import split_messages
from runtimeproxy.frames.frame import ErrorCode, Flag, FrameError, FrameType
from runtimeproxy.frames.msgsize import MessageSizes, StreamSizes
from runtimeproxy.frames.outbound import Outbound


def test_round_trip_and_incomplete() -> None:
    raw = fr.serialize(FrameType.DATA, Flag.END_STREAM, 7, b"hello")
    for cut in range(len(raw)):
        assert fr.parse(raw[:cut], 0, fr.DEFAULT_MAX_FRAME) == (None, 0)
    f, nxt = fr.parse(raw + b"rest", 0, fr.DEFAULT_MAX_FRAME)
    assert f is not None and nxt == len(raw)
    assert (f.type, f.flags, f.stream_id, bytes(f.payload)) == (FrameType.DATA, Flag.END_STREAM, 7, b"hello")


def test_oversized_frame_is_a_frame_size_error() -> None:
    raw = fr.serialize(FrameType.DATA, 0, 1, b"x" * 17)
    with pytest.raises(FrameError) as err:
        fr.parse(raw, 0, 16)
    assert err.value.code == ErrorCode.FRAME_SIZE_ERROR


def test_a_carried_frame_is_completed_from_later_reads_and_leaves_the_rest() -> None:
    frame = fr.serialize(FrameType.DATA, 0, 1, b"x" * 20)
    carry = fr.Carry()
    carry.keep(memoryview(frame[:4]))  # cut inside the frame header
    assert carry.complete(frame[4:10], 100) == (None, 6)
    assert carry.complete(frame[10:] + b"next", 100) == (frame, len(frame) - 10)
    assert not carry.buf


def test_a_carried_frame_over_the_max_frame_size_is_refused_once_its_header_is_complete() -> None:
    frame = fr.serialize(FrameType.DATA, 0, 1, b"x" * 200)
    carry = fr.Carry()
    carry.keep(memoryview(frame[:2]))
    with pytest.raises(FrameError) as err:
        carry.complete(frame[2:12], 100)  # before its payload is there
    assert err.value.code == ErrorCode.FRAME_SIZE_ERROR


def test_reserved_bit_of_the_stream_id_is_ignored() -> None:
    raw = bytearray(fr.serialize(FrameType.PING, 0, 0, b"\x00" * 8))
    raw[5] |= 0x80
    f, _ = fr.parse(bytes(raw), 0, fr.DEFAULT_MAX_FRAME)
    assert f is not None and f.stream_id == 0


@pytest.mark.parametrize(
    ("flags", "payload", "body"),
    [
        (Flag.PADDED, b"\x03abc\x00\x00\x00", b"abc"),
        (0, b"abc", b"abc"),
    ],
)
def test_unpadded(flags: int, payload: bytes, body: bytes) -> None:
    assert bytes(fr.unpadded(fr.Frame(FrameType.DATA, flags, 1, payload))) == body


def test_padding_longer_than_the_frame_is_a_protocol_error() -> None:
    with pytest.raises(FrameError) as err:
        fr.unpadded(fr.Frame(FrameType.DATA, Flag.PADDED, 1, b"\x09ab"))
    assert err.value.code == ErrorCode.PROTOCOL_ERROR


def test_headers_priority_fields_are_skipped() -> None:
    f = fr.Frame(FrameType.HEADERS, Flag.PRIORITY, 1, b"\x00\x00\x00\x03\x10block")
    assert bytes(fr.unpadded(f)) == b"block"


def test_header_and_data_frames_split_at_the_max_frame_size() -> None:
    frames = fr.data_frames(3, b"x" * 40_000, 16_384, end_stream=True)
    parsed = [fr.parse(raw, 0, 16_384)[0] for raw in frames]
    assert [len(f.payload) for f in parsed] == [16_384, 16_384, 7_232]
    assert [f.has(Flag.END_STREAM) for f in parsed] == [False, False, True]
    blocks = fr.header_frames(3, b"h" * 20_000, 16_384, end_stream=True)
    parsed = [fr.parse(raw, 0, 16_384)[0] for raw in blocks]
    assert [f.type for f in parsed] == [FrameType.HEADERS, FrameType.CONTINUATION]
    assert parsed[0].has(Flag.END_STREAM) and not parsed[0].has(Flag.END_HEADERS) and parsed[1].has(Flag.END_HEADERS)


def test_own_header_blocks_leave_the_peers_table_alone() -> None:
    decoder = hpack.Decoder()
    block = encode_headers([(":status", "200"), ("grpc-status", "0"), ("x-bin", b"\x00\xff")])
    assert decoder.decode(block) == [(":status", "200"), ("grpc-status", "0"), ("x-bin", "AP8")]
    assert len(decoder.header_table.dynamic_entries) == 0


def test_message_sizes_across_frames() -> None:
    sizes = MessageSizes(limit=10)
    message = struct.pack(">BI", 0, 8) + b"x" * 8
    assert sizes.feed(message[:3]) is None  # a prefix split over frames
    assert sizes.feed(message[3:] + message) is None
    too_long = struct.pack(">BI", 0, 11)
    assert sizes.feed(too_long[:2]) is None
    assert sizes.feed(too_long[2:]) == 11


@pytest.mark.parametrize(("value", "seconds"), [("5S", 5.0), ("250m", 0.25), ("7u", 7e-6), ("1H", 3600.0),
                                                ("x", None), ("12", None), ("S", None),
                                                ("\u00b2S", None), ("1\u0663m", None),  # digits int() refuses
                                                ("99999999H", 99999999 * 3600.0), ("999999999H", None),
                                                ("9" * 400 + "S", None), ("9" * 5000 + "S", None)])  # over 8 digits
def test_grpc_timeout(value: str, seconds: float | None) -> None:
    assert parse_timeout(value) == seconds


def test_split_messages() -> None:
    two = struct.pack(">BI", 0, 1) + b"a" + struct.pack(">BI", 0, 0)
    assert split_messages(two) == [b"a", b""]
    assert isinstance(split_messages(two[:-1]), str)
    assert "compressed" in split_messages(struct.pack(">BI", 1, 1) + b"a")  # type: ignore[operator]


class _Writer:
    def __init__(self) -> None:
        self.written = b""

    def write(self, data: bytes) -> None:
        self.written += data

    def writelines(self, pieces: list[bytes]) -> None:
        self.write(b"".join(pieces))

    def is_closing(self) -> bool:
        return False


def _frames(data: bytes) -> list[fr.Frame]:
    out, pos = [], 0
    while True:
        f, pos = fr.parse(data, pos, fr.MAX_FRAME_LIMIT)
        if f is None:
            return out
        out.append(f)


def test_outbound_keeps_the_client_window_and_order() -> None:
    writer, credits = _Writer(), []
    out = Outbound(writer, credits.append, hold_limit=1 << 30)  # type: ignore[arg-type]
    out.preface(b"")  # the server preface is out: nothing is held
    out.data(1, b"a" * 60_000, False, credit=60_000)
    out.frames(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 3, b"\x88"))
    out.data(1, b"b" * 10_000, True, credit=10_000)  # over the window: waits, and what follows it too
    out.frames(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, b"\x88"))
    out.control(fr.window_update(0, 5))  # not held behind DATA
    out.flush()
    sent = _frames(writer.written)
    assert [(f.type, f.stream_id, len(f.payload)) for f in sent] == [
        (FrameType.DATA, 1, 60_000), (FrameType.HEADERS, 3, 1), (FrameType.DATA, 1, 5_535),
        (FrameType.WINDOW_UPDATE, 0, 4),
    ]
    assert out.window == 0 and credits == [60_000]
    out.grow(100_000)
    out.flush()
    rest = _frames(writer.written)[len(sent):]
    assert [(f.type, f.stream_id, len(f.payload), f.has(Flag.END_STREAM)) for f in rest] == [
        (FrameType.DATA, 1, 4_465, True), (FrameType.HEADERS, 1, 1, True),
    ]
    assert credits == [60_000, 10_000]


def test_outbound_sends_nothing_before_the_server_preface_and_it_first() -> None:
    writer = _Writer()
    out = Outbound(writer, lambda n: None, hold_limit=1 << 30)  # type: ignore[arg-type]
    out.control(fr.serialize(FrameType.PING, Flag.ACK, 0, b"12345678"))
    out.frames(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, b"\x88"))
    out.flush()
    assert writer.written == b""
    out.preface(fr.serialize(FrameType.SETTINGS, 0, 0))
    out.flush()
    assert [f.type for f in _frames(writer.written)] == [FrameType.SETTINGS, FrameType.PING, FrameType.HEADERS]


async def test_a_closed_outbound_cancels_its_gates_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gates' timer held the connection's sending side (and through it the
    connection) until the earliest limit, a second on; closed, it goes at once."""
    loop = asyncio.get_running_loop()
    timers: list[asyncio.TimerHandle] = []
    real_call_at = loop.call_at

    def call_at(*args: Any) -> asyncio.TimerHandle:
        timers.append(real_call_at(*args))
        return timers[-1]

    monkeypatch.setattr(loop, "call_at", call_at)
    out = Outbound(_Writer(), lambda n: None, hold_limit=1 << 30)  # type: ignore[arg-type]
    out.preface(b"")
    gate = out.gate(b"", 60.0, lambda: True)
    assert len(timers) == 1 and not timers[0].cancelled()
    out.close()
    assert timers[0].cancelled()
    assert not gate.is_open


def test_outbound_window_overflow_is_a_flow_control_error() -> None:
    out = Outbound(_Writer(), lambda n: None, hold_limit=1 << 30)  # type: ignore[arg-type]
    out.preface(b"")  # the server preface is out: nothing is held
    with pytest.raises(FrameError) as err:
        out.grow(fr.MAX_WINDOW)
    assert err.value.code == ErrorCode.FLOW_CONTROL_ERROR


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 255]), st.integers(0, 300)), min_size=1, max_size=6),
       st.lists(st.integers(0, 97), min_size=1, max_size=40).filter(any), st.integers(0, 200))
def test_message_sizes_find_the_first_message_over_the_limit_however_the_stream_is_split(
        messages, cuts, limit) -> None:  # type: ignore[no-untyped-def]
    """Messages (5-byte prefix, its flag byte any value, + body) cut into DATA
    frames at arbitrary points, empty ones too: the tracker names the first one
    over the limit in the frame where its prefix ends; so does ``feed_at``, the
    relay's loops' way to it, on the frame within a read, in the same state
    after each frame (a prefix carried whole or in part); and so does a
    stream's StreamSizes, its tracker made at its first frame (the relay's
    loops read a whole message without one)."""
    stream = b"".join(struct.pack(">BI", flag, n) + b"m" * n for flag, n in messages)
    first_over = next((n for _, n in messages if n > limit), None)
    sizes, in_place, streams, found, pos, i = MessageSizes(limit), MessageSizes(limit), StreamSizes(limit), None, 0, 0
    while pos < len(stream) and found is None:
        chunk = stream[pos: pos + cuts[i % len(cuts)]]
        pos += len(chunk)
        i += 1
        found = sizes.feed(memoryview(chunk))
        assert in_place.feed_at(b"\xff" * 9 + chunk + b"\xff", 9, len(chunk)) == found
        assert streams.feed_at(7, b"\xff" * 9 + chunk + b"\xff", 9, len(chunk)) == found
        state = (sizes.remaining, sizes._prefix)  # noqa: SLF001
        assert (in_place.remaining, in_place._prefix) == state  # noqa: SLF001
        tracker = streams.get(7)
        assert ((tracker.remaining, tracker._prefix) if tracker else (0, b"")) == state  # noqa: SLF001
    assert found == first_over


def test_compressed_messages_are_inflated_within_the_limit() -> None:
    import zlib

    from runtimeproxy.frames.messages import BadMessages

    def framed(payload: bytes, flag: int = 1) -> bytes:
        return struct.pack(">BI", flag, len(payload)) + payload

    text = b"x" * 1000
    gzipped = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    gz = gzipped.compress(text) + gzipped.flush()
    deflated = zlib.compress(text)
    assert split_messages(framed(gz) + framed(b"plain", 0), b"gzip", 1000) == [text, b"plain"]
    assert split_messages(framed(deflated), b"deflate", 1000) == [text]
    cases = {
        "over": (split_messages(framed(gz), b"gzip", 999), grpc.StatusCode.RESOURCE_EXHAUSTED),
        "unknown": (split_messages(framed(gz), b"snappy", 1000), grpc.StatusCode.UNIMPLEMENTED),
        "flag-without-encoding": (split_messages(framed(gz), b"identity", 1000), grpc.StatusCode.INTERNAL),
        "garbage": (split_messages(framed(b"not gzip"), b"gzip", 1000), grpc.StatusCode.INTERNAL),
        "cut": (split_messages(framed(gz[:-12]), b"gzip", 1000), grpc.StatusCode.INTERNAL),
        "not-read": (split_messages(framed(gz)), grpc.StatusCode.UNIMPLEMENTED),
        # bytes after the end are refused, as grpc refuses them ("not all input consumed")
        "gzip-and-junk": (split_messages(framed(gz + b"junk"), b"gzip", 1000), grpc.StatusCode.INTERNAL),
        "deflate-and-junk": (split_messages(framed(deflated + b"junk"), b"deflate", 1000), grpc.StatusCode.INTERNAL),
        "two-gzip-members": (split_messages(framed(gz + gz), b"gzip", 2000), grpc.StatusCode.INTERNAL),
    }
    for name, (bad, code) in cases.items():
        assert isinstance(bad, BadMessages) and bad.code == code, name
    bomb = zlib.compress(b"\0" * (64 << 20))  # 64 MiB of zeros in ~64 kB: refused at the limit, not inflated whole
    assert split_messages(framed(bomb), b"deflate", 16 << 20).code == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[union-attr]
    # an empty message with the flag set is an empty message, as grpc reads it
    assert split_messages(framed(b""), b"gzip", 1000) == [b""]


def test_a_bomb_is_inflated_only_up_to_the_limit() -> None:
    """Guards existing behaviour (zlib's max_length): not inflated whole and
    then measured: the memory it takes stays near
    the limit (16 MiB; zlib's output blocks and their join take twice that),
    not near the bomb's 64 MiB (twice that, inflated whole)."""
    import tracemalloc
    import zlib

    from runtimeproxy.frames.messages import inflate

    squeeze = zlib.compressobj(1)
    bomb = squeeze.compress(bytes(64 << 20)) + squeeze.flush()
    tracemalloc.start()
    try:
        refused = inflate(bomb, b"deflate", 16 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[union-attr]
    assert peak < 48 << 20, peak
