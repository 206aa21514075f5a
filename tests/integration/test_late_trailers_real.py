"""Request trailers on a stream the runtime no longer has open, through the
proxy to a real containerd: the proxy drops them, and the connection's next
call is served. Before: on a stream the proxy had ended they were a
connection error of the proxy's (`stream N reused`), and a diverted call's
reached containerd, and 1.7 (its grpc-go: `received an illegal stream id`)
ended its whole connection, every call on it with it (frames/withheld.py; the raw-runtime tests are
tests/component/frames/test_late_trailers.py)."""

from __future__ import annotations

import struct

import hpack
import pytest

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import Flag, FrameType

from ..component import rawh2
from .proxyfixtures import ProxyLauncher

VERSION = "/runtime.v1.RuntimeService/Version"
HEALTH = "/grpc.health.v1.Health/Check"  # the proxy answers it itself (diverted)


def _request(encoder: hpack.Encoder, sid: int, path: str) -> bytes:
    block = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
                            ("content-type", "application/grpc"), ("te", "trailers")])
    return fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, block)


async def _until_end(peer: rawh2.RawPeer, sid: int) -> list[tuple[str, str]]:
    """Every header block read (decoded in order) up to ``sid``'s end: its last block."""
    while (f := await peer.read()) is not None:
        kind, flags, stream, payload = f
        assert kind != rawh2.GOAWAY, f"the connection goes away: {payload!r}"
        if kind == rawh2.HEADERS:
            headers = peer.decoder.decode(payload)
            if stream == sid and flags & Flag.END_STREAM:
                return headers
    raise AssertionError("the connection closed")


@pytest.mark.parametrize("first", ["diverted", "refused-size"])
async def test_trailers_after_a_calls_end_leave_containerds_connection_serving(
    launcher: ProxyLauncher, first: str
) -> None:
    await launcher.start()
    peer = await rawh2.RawPeer.connect(launcher.socket)
    try:
        peer.writer.write(fr.serialize(FrameType.SETTINGS, 0, 0))
        await peer.until(rawh2.SETTINGS)
        peer.writer.write(fr.serialize(FrameType.SETTINGS, Flag.ACK, 0))
        encoder = hpack.Encoder()
        if first == "diverted":
            body = rawh2.message(b"")
        else:  # says 64 MiB: over the limit, the call is refused while the client still sends
            body = struct.pack(">BI", 0, 64 << 20) + b"x" * 10
        peer.writer.write(_request(encoder, 1, HEALTH if first == "diverted" else VERSION)
                          + fr.serialize(FrameType.DATA, 0, 1, body))
        if first == "refused-size":
            assert dict(await _until_end(peer, 1))["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
        # Trailers that add to the client's HPACK table (hpack indexes new headers).
        trailers = encoder.encode([("x-late", "trailer")])
        peer.writer.write(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, trailers))
        if first == "diverted":
            assert dict(await _until_end(peer, 1))["grpc-status"] == "0"  # health: the proxy's own answer
        peer.writer.write(_request(encoder, 3, VERSION) + fr.serialize(FrameType.DATA, Flag.END_STREAM, 3,
                                                                      rawh2.message(b"")))
        assert dict(await _until_end(peer, 3))["grpc-status"] == "0"  # containerd answered it
    finally:
        await peer.close()
