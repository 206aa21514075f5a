"""The stream ids a client's header block in one frame may name (RFC 9113
5.1.1), read in the relay's loop (upstream.ClientSide._frames), which calls
``_new_stream`` only for an id that is not a new odd one: stream 0, an even
id, or one it opened before without END_STREAM (the same stream reused, or
one skipped) end the connection (GOAWAY PROTOCOL_ERROR); trailers
(END_STREAM) on a stream that ended are read and dropped (withheld.py)."""

from __future__ import annotations

import hpack
import pytest

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import FrameConnection, Limits
from runtimeproxy.frames.frame import ErrorCode, Flag, FrameType
from tests.frameroutes import Routes
from tests.frametransport import Transport

from .test_connection import VERSION, _written_frames


class _Client:
    """A relaying connection whose client has had stream 1 answered and ended, and stream 5 opened."""

    def __init__(self) -> None:
        self.client, self.backend = Transport(), Transport()
        self.conn = FrameConnection(self.client, self.backend, Routes(), None,  # type: ignore[arg-type]
                                    Limits(max_message=100))
        self.encoder, answers = hpack.Encoder(), hpack.Encoder()
        self.conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
        self.conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
        self.conn.client_data(self.headers(1, Flag.END_HEADERS) + fr.serialize(FrameType.DATA, Flag.END_STREAM, 1, b"\0" * 5))
        self.conn.backend_data(
            fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, answers.encode([(":status", "200")]))
            + fr.serialize(FrameType.DATA, 0, 1, b"\0" * 5)
            + fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, answers.encode([("grpc-status", "0")])))
        self.conn.client_data(self.headers(5, Flag.END_HEADERS))
        assert self.conn.relayed == {5} and not self.conn.closed.done()

    def headers(self, sid: int, flags: int) -> bytes:
        block = self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", VERSION),
                                     (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
        return fr.serialize(FrameType.HEADERS, flags, sid, block)

    def goaways(self) -> list[int]:
        return [int.from_bytes(bytes(f.payload[4:8]), "big") for f in _written_frames(self.client)
                if f.type == FrameType.GOAWAY]


@pytest.mark.parametrize("sid", [0, 2, 6, 1, 3], ids=["stream 0", "even", "even, above the latest", "reused", "skipped"])
async def test_a_header_block_on_a_stream_the_client_cannot_open_ends_the_connection(sid: int) -> None:
    client = _Client()
    client.conn.client_data(client.headers(sid, Flag.END_HEADERS))
    assert client.conn.closed.done() and client.goaways() == [ErrorCode.PROTOCOL_ERROR]


async def test_trailers_on_a_stream_that_ended_are_dropped_and_the_connection_goes_on() -> None:
    """Guards existing behaviour (late trailers, withheld.py) through the relay's loop."""
    client = _Client()
    sent = len(b"".join(client.backend.written))
    client.conn.client_data(client.headers(1, Flag.END_HEADERS | Flag.END_STREAM))
    assert not client.conn.closed.done() and client.goaways() == []
    assert len(b"".join(client.backend.written)) == sent  # the runtime never sees them
    client.conn.client_data(client.headers(7, Flag.END_HEADERS))  # and a new call still opens
    assert client.conn.relayed == {5, 7} and not client.conn.closed.done()
