"""splice.Splice: the GOAWAY that sends a spliced client back is written
between two of the server's frames, whatever pieces they come in, never inside
a header block (HEADERS without END_HEADERS and its CONTINUATION frames: a
frame between them is a connection error for the client), never before the
server's first frame nor after a GOAWAY of the server's own; the server's bytes
pass unchanged."""

from __future__ import annotations

import pytest

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.splice import Splice


class Client:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing


SETTINGS = fr.serialize(fr.FrameType.SETTINGS, 0, 0, b"\x00\x04\x00\x00\xff\xff")
HEADERS = fr.serialize(fr.FrameType.HEADERS, fr.Flag.END_HEADERS, 1, b"\x88" * 40)
DATA = fr.serialize(fr.FrameType.DATA, 0, 1, b"x" * 3000)
EMPTY = fr.serialize(fr.FrameType.DATA, fr.Flag.END_STREAM, 1, b"")
# A header block in three frames, as a grpc core server writes trailers past its frame size.
OPEN = fr.serialize(fr.FrameType.HEADERS, fr.Flag.END_STREAM, 1, b"\x88" * 20)
MORE = fr.serialize(fr.FrameType.CONTINUATION, 0, 1, b"\x88" * 12)
LAST = fr.serialize(fr.FrameType.CONTINUATION, fr.Flag.END_HEADERS, 1, b"\x88" * 5)
STREAM = [SETTINGS, HEADERS, DATA, EMPTY, OPEN, MORE, LAST, HEADERS]
# Told to go away at these offsets into STREAM: in each frame, at its ends, and inside the header block.
_ENDS = [sum(len(f) for f in STREAM[:i]) for i in range(len(STREAM) + 1)]
TOLD_AT = sorted({0, 1, 5, 9, 10, 60, 3000}
                 | {t for end in _ENDS for d in (-1, 0, 1, 9) if 0 <= (t := end + d) <= _ENDS[-1]})


def in_block(frame: bytes) -> bool:
    """Whether ``frame`` leaves a header block open: CONTINUATION frames must come next."""
    return frame[3] in (fr.FrameType.HEADERS, fr.FrameType.PUSH_PROMISE, fr.FrameType.CONTINUATION) \
        and not frame[4] & fr.Flag.END_HEADERS


def frames_of(data: bytes) -> list[tuple[int, bytes]]:
    """(type, whole frame) of each frame in ``data``, which must end at a boundary."""
    out, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 3], "big")
        out.append((data[pos + 3], bytes(data[pos:pos + fr.HEADER_LEN + length])))
        pos += fr.HEADER_LEN + length
    assert pos == len(data)
    return out


def feed(splice: Splice, data: bytes, size: int) -> None:
    for i in range(0, len(data), size):
        splice.from_server(data[i:i + size])


@pytest.mark.parametrize("size", [1, 2, 7, 9, 10, 100, 4096])
@pytest.mark.parametrize("told_after", TOLD_AT)
def test_the_goaway_goes_between_two_frames_and_the_rest_passes_unchanged(size: int, told_after: int) -> None:
    client = Client()
    splice = Splice(client)  # type: ignore[arg-type]
    stream = b"".join(STREAM)
    feed(splice, stream[:told_after], size)
    splice.go_away()
    splice.go_away()  # told once
    feed(splice, stream[told_after:], size)
    got = frames_of(bytes(client.written))
    goaways = [i for i, (kind, _) in enumerate(got) if kind == fr.FrameType.GOAWAY]
    assert len(goaways) == 1 and goaways[0] > 0  # after the server's SETTINGS at least
    goaway = got.pop(goaways[0])[1]
    assert goaway[fr.HEADER_LEN:fr.HEADER_LEN + 8] == ((1 << 31) - 1).to_bytes(4, "big") + bytes(4)  # all streams, NO_ERROR
    assert b"".join(whole for _, whole in got) == stream
    assert sum(len(f) for f in STREAM[:goaways[0]]) >= told_after  # not before the frame being read ended
    assert not in_block(STREAM[goaways[0] - 1])  # not inside a header block


@pytest.mark.parametrize("opener", [fr.FrameType.HEADERS, fr.FrameType.PUSH_PROMISE])
def test_told_inside_a_header_block_it_goes_after_the_blocks_last_frame(opener: int) -> None:
    """Told at a frame's end inside a header block: written only once END_HEADERS has gone by."""
    client = Client()
    splice = Splice(client)  # type: ignore[arg-type]
    open_ = fr.serialize(opener, 0, 1, b"\x00\x00\x00\x02" * (opener == fr.FrameType.PUSH_PROMISE) + b"\x88" * 20)
    splice.from_server(SETTINGS + open_)
    splice.go_away()
    assert bytes(client.written) == SETTINGS + open_
    splice.from_server(MORE)
    splice.go_away()
    assert bytes(client.written) == SETTINGS + open_ + MORE
    splice.from_server(LAST + HEADERS)
    assert [kind for kind, _ in frames_of(bytes(client.written))] == [
        fr.FrameType.SETTINGS, opener, fr.FrameType.CONTINUATION, fr.FrameType.CONTINUATION,
        fr.FrameType.GOAWAY, fr.FrameType.HEADERS]


def test_no_goaway_before_the_servers_first_frame() -> None:
    client = Client()
    splice = Splice(client)  # type: ignore[arg-type]
    splice.go_away()
    assert client.written == b""
    splice.from_server(SETTINGS[:4])
    assert client.written == SETTINGS[:4]
    splice.from_server(SETTINGS[4:])
    assert [kind for kind, _ in frames_of(bytes(client.written))] == [fr.FrameType.SETTINGS, fr.FrameType.GOAWAY]


def test_none_after_the_servers_own_goaway() -> None:
    """Its last stream id may be lower: a higher one after it is a connection error for grpc-go."""
    client = Client()
    splice = Splice(client)  # type: ignore[arg-type]
    own = fr.goaway(3, fr.ErrorCode.NO_ERROR)
    splice.from_server(SETTINGS + own[:5])
    splice.go_away()
    splice.from_server(own[5:] + HEADERS)
    assert bytes(client.written) == SETTINGS + own + HEADERS


def test_none_to_a_client_gone() -> None:
    client = Client()
    splice = Splice(client)  # type: ignore[arg-type]
    splice.from_server(SETTINGS)
    client.closing = True
    splice.go_away()
    assert bytes(client.written) == SETTINGS
