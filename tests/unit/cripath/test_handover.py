"""The activation relay's hand-over on the grpc path (handover.py): after the
cut, streams the client opens never reach grpc and are refused; everything
else reaches it whole; refusals go between two of grpc's frames, never inside
a header block. Every case is fed in pieces cut at arbitrary points, as reads
come."""

from __future__ import annotations

import struct
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtimeproxy.cripath.handover import ClientStreams, ServerFrames
from runtimeproxy.frames.frame import PREFACE, ErrorCode, Flag, FrameType, rst_stream, serialize


def frame(kind: int, sid: int, payload: bytes = b"", flags: int = 0) -> bytes:
    return serialize(kind, flags, sid, payload)


def headers(sid: int, end_headers: bool = True) -> bytes:
    return frame(FrameType.HEADERS, sid, b"\x82\x86" * 3, Flag.END_HEADERS if end_headers else 0)


def data(sid: int, size: int = 40) -> bytes:
    return frame(FrameType.DATA, sid, (bytes(range(256)) * (size // 256 + 1))[:size], Flag.END_STREAM)


WINDOW_0 = frame(FrameType.WINDOW_UPDATE, 0, struct.pack(">I", 1000))
PING = frame(FrameType.PING, 0, b"12345678")
BEFORE = PREFACE + frame(FrameType.SETTINGS, 0) + headers(1) + data(1, 300)
AFTER_KEPT = [WINDOW_0, PING, frame(FrameType.RST_STREAM, 1, struct.pack(">I", ErrorCode.CANCEL)),
              frame(FrameType.WINDOW_UPDATE, 1, struct.pack(">I", 5))]
AFTER_DROPPED = [headers(3, end_headers=False), frame(FrameType.CONTINUATION, 3, b"\x84", Flag.END_HEADERS),
                 data(3, 5000), frame(FrameType.WINDOW_UPDATE, 3, struct.pack(">I", 5)), headers(5), data(5)]
AFTER = [AFTER_DROPPED[0], AFTER_KEPT[0], *AFTER_DROPPED[1:3], *AFTER_KEPT[1:3], *AFTER_DROPPED[3:], AFTER_KEPT[3]]


def refusal(sid: int) -> bytes:
    return rst_stream(sid, ErrorCode.REFUSED_STREAM)


def pieces(blob: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(blob), *(c % (len(blob) + 1) for c in cuts)})
    return [blob[a:b] for a, b in pairwise(points)]


def split_frames(blob: bytes) -> list[bytes]:
    """``blob`` as whole frames; fails if it is not."""
    out, i = [], 0
    while i < len(blob):
        size = int.from_bytes(blob[i : i + 3], "big")
        assert i + 9 + size <= len(blob), "a frame cut short"
        out.append(blob[i : i + 9 + size])
        i += 9 + size
    return out


def relay(streams: ClientStreams, blob: bytes, cuts: list[int]) -> bytes:
    return b"".join(streams.feed(piece) for piece in pieces(blob, cuts))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0), max_size=12), st.lists(st.integers(min_value=0), max_size=12))
def test_after_the_cut_new_streams_are_kept_from_grpc_and_refused(before: list[int], after: list[int]) -> None:
    refused: list[int] = []
    streams = ClientStreams(refused.append)
    assert relay(streams, BEFORE, before) == BEFORE  # verbatim until the cut
    assert streams.last_opened == 1
    streams.cut()
    passed = relay(streams, b"".join(AFTER), after)
    assert split_frames(passed) == AFTER_KEPT
    assert refused == [3, 5]
    assert streams.dropped == 5000 + 40  # the window the client is owed


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0), st.lists(st.integers(min_value=0), max_size=8))
def test_a_frame_begun_before_the_cut_goes_on_whole(at: int, after: list[int]) -> None:
    """A cut at any byte: what grpc gets is whole frames, the new stream's
    included if its header had begun to go out, and refused only if not."""
    blob = BEFORE + headers(3) + data(3, 100) + PING
    at %= len(blob) + 1
    refused: list[int] = []
    streams = ClientStreams(refused.append)
    passed = streams.feed(blob[:at])
    streams.cut()
    passed += relay(streams, blob[at:], after)
    # A stream is refused if its first header had not begun to go out.
    opened_at = {1: len(PREFACE) + 9, 3: len(BEFORE)}
    assert blob[opened_at[1] + 3] == blob[opened_at[3] + 3] == FrameType.HEADERS
    expected = [sid for sid, start in opened_at.items() if at <= start]
    assert refused == expected
    frames = split_frames(passed[len(PREFACE) :])
    assert frames == [f for f in split_frames(blob[len(PREFACE) :]) if int.from_bytes(f[5:9], "big") not in expected]


@pytest.mark.parametrize("piece", [1, 7, 1000])
def test_a_header_block_of_the_clients_reaches_grpc_whole_or_not_at_all(piece: int) -> None:
    """A cut at any byte of a block in three frames (HEADERS without
    END_HEADERS, CONTINUATION, CONTINUATION with it): grpc gets all three if
    the HEADERS had begun to go out, else none, the stream refused; a frame
    kept from grpc inside the block would be a connection error for grpc."""
    block = [headers(3, end_headers=False), frame(FrameType.CONTINUATION, 3, b"\x84" * 9),
             frame(FrameType.CONTINUATION, 3, b"\x85", Flag.END_HEADERS)]
    blob = BEFORE + b"".join(block) + data(3, 30) + headers(5) + PING
    for at in range(len(BEFORE), len(BEFORE) + sum(map(len, block)) + 1):
        refused: list[int] = []
        streams = ClientStreams(refused.append)
        passed = streams.feed(blob[:at])
        streams.cut()
        passed += relay(streams, blob[at:], list(range(piece, len(blob), piece)))
        frames = split_frames(passed[len(PREFACE) :])
        opened = at > len(BEFORE)
        assert [f for f in frames if f in block] == (block if opened else []), at
        assert refused == ([5] if opened else [3, 5]), at
        assert frames[-1] == PING


def test_a_client_that_is_not_http2_is_passed_on_for_grpc_to_refuse() -> None:
    streams = ClientStreams(lambda sid: None)
    garbage = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 3
    assert streams.feed(garbage) == garbage


GOAWAY = frame(FrameType.GOAWAY, 0, struct.pack(">II", 0x7FFFFFFF, 0))
GRPC_FRAMES = [frame(FrameType.SETTINGS, 0, b"\x00\x04\x00\x01\x00\x00"), frame(FrameType.HEADERS, 1, b"\x88"),
               data(1, 20000), GOAWAY, frame(FrameType.PING, 0, b"87654321"), frame(FrameType.DATA, 1, b""),
               frame(FrameType.HEADERS, 1, b"\x89", 5)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0), max_size=12), st.integers(min_value=0), st.integers(min_value=1, max_value=3))
def test_refusals_go_between_grpcs_frames_after_its_goaway(cuts: list[int], where: int, count: int) -> None:
    """Never inside one of grpc's frames, and never before its first GOAWAY: a
    client retries a refused stream once, on a new connection only once told
    to go away."""
    refusals = [refusal(sid) for sid in range(3, 3 + 2 * count, 2)]
    server = ServerFrames()
    out: list[bytes] = []
    parts = pieces(b"".join(GRPC_FRAMES), cuts)
    at = where % (len(parts) + 1)
    for i, part in enumerate(parts):
        if i == at:
            out += [server.insert(r) for r in refusals]
        out.append(server.feed(part))
    if at == len(parts):
        out += [server.insert(r) for r in refusals]
    frames = split_frames(b"".join(out))
    assert [f for f in frames if f not in refusals] == GRPC_FRAMES
    first = frames.index(refusals[0])
    assert frames[first : first + count] == refusals
    assert first > frames.index(GOAWAY)


def grpc_block(opener: int) -> list[bytes]:
    """A header block of grpc's in three frames, as grpc writes trailers past the client's frame size."""
    promised = struct.pack(">I", 2) if opener == FrameType.PUSH_PROMISE else b""
    return [frame(opener, 1, promised + b"\x88" * 20, Flag.END_STREAM), frame(FrameType.CONTINUATION, 1, b"\x89" * 12),
            frame(FrameType.CONTINUATION, 1, b"\x8a" * 5, Flag.END_HEADERS)]


def leaves_block_open(f: bytes) -> bool:
    return f[3] in (FrameType.HEADERS, FrameType.PUSH_PROMISE, FrameType.CONTINUATION) and not f[4] & Flag.END_HEADERS


@pytest.mark.parametrize("opener", [FrameType.HEADERS, FrameType.PUSH_PROMISE])
def test_refusals_never_go_inside_a_header_block_of_grpcs(opener: int) -> None:
    """A frame between a HEADERS (or PUSH_PROMISE) without END_HEADERS and its
    CONTINUATION frames is a connection error for the client (RFC 9113 6.10):
    grpc-go fails every call on the connection. Fed split at every offset,
    with a refusal asked for at every frame end (and at the split), none goes
    inside the block, and the one asked for inside it follows it directly."""
    grpc = [*GRPC_FRAMES[:2], data(1, 30), GOAWAY, *grpc_block(opener), PING, data(1, 10)]
    blob = b"".join(grpc)
    ends = [sum(map(len, grpc[:i])) for i in range(len(grpc) + 1)]
    for split in range(len(blob) + 1):
        for asked in sorted({*ends, split}):
            server = ServerFrames()
            out = []
            for a, b in pairwise(sorted({0, split, asked, len(blob)})):
                if a == asked:
                    out.append(server.insert(refusal(3)))
                out.append(server.feed(blob[a:b]))
            if asked == len(blob):
                out.append(server.insert(refusal(3)))
            frames = split_frames(b"".join(out))
            assert [f for f in frames if f != refusal(3)] == grpc
            at = frames.index(refusal(3))
            assert not leaves_block_open(frames[at - 1]), (split, asked)
            # Held no longer: after grpc's frame being passed (its GOAWAY at the
            # earliest), or inside the block, after the block's last frame.
            passed = max(next(i for i, end in enumerate(ends) if end >= asked), 4)
            assert at == (7 if passed in (5, 6) else passed), (split, asked)


def test_refusals_held_when_grpc_closes_go_out_between_its_frames() -> None:
    server = ServerFrames()
    assert server.insert(refusal(3)) == b""
    assert server.end() == b""  # grpc never spoke: no frame may go before its SETTINGS
    server = ServerFrames()
    head = server.feed(GRPC_FRAMES[0] + GRPC_FRAMES[2][:100])
    assert server.insert(refusal(3)) == b""
    assert server.end() == b""  # inside a frame: the connection ends anyway, the frame may not be broken
    server = ServerFrames()
    assert server.feed(b"".join(GRPC_FRAMES[:3])) == b"".join(GRPC_FRAMES[:3])
    assert server.insert(refusal(3)) == b""  # no GOAWAY yet
    assert server.end() == refusal(3)  # closing: the client still learns it may retry
    assert head == GRPC_FRAMES[0] + GRPC_FRAMES[2][:100]
    server = ServerFrames()
    opened = b"".join(GRPC_FRAMES[:4]) + grpc_block(FrameType.HEADERS)[0]
    assert server.feed(opened) == opened
    assert server.insert(refusal(3)) == b""  # between two frames, but inside a header block
    assert server.end() == b""  # the block may not be broken either
