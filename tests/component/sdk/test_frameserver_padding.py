"""The SDK's frames transport reads a request sent in padded frames (RFC 9113 section 6.1:
a pad length, then the data, then that much padding) as the same request unpadded, and
counts the padding against the flow-control window, as HTTP/2 has it."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from cri_api.hookapi import api_pb2 as hookapi

from ..rawh2 import DATA, END_HEADERS, END_STREAM, HEADERS, frame, literal_headers, raw_with_settings
from . import scriptedserver
from .scriptedserver import PRE_CREATE, Scripted, hook_request_bytes

frames = scriptedserver.frames  # the fixture, here for pytest to find
PADDED, PRIORITY = 0x8, 0x20


def _padded(kind: int, flags: int, stream: int, data: bytes, pad: int | None, priority: bool = False) -> bytes:
    head = struct.pack(">IB", 0, 16) if priority else b""  # no dependency, weight 16
    if pad is None:
        return frame(kind, flags | (PRIORITY if priority else 0), stream, head + data)
    return frame(kind, flags | PADDED | (PRIORITY if priority else 0), stream, bytes([pad]) + head + data + b"\0" * pad)


@pytest.mark.parametrize("pads", [(None, None, None), (0, 0, 0), (1, None, 200), (255, 7, 0)])
async def test_a_request_in_padded_frames_is_read_as_the_same_request(frames: Scripted, pads: tuple) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    block = literal_headers([(":method", "POST"), (":scheme", "http"), (":path", PRE_CREATE.full_method),
                             (":authority", "x"), ("content-type", "application/grpc")])
    message = hook_request_bytes("5")
    body = b"\x00" + struct.pack(">I", len(message)) + message
    half = len(body) // 2
    header_pad, first_pad, last_pad = pads
    peer.writer.write(_padded(HEADERS, END_HEADERS, 1, block, header_pad, priority=header_pad is not None)
                      + _padded(DATA, 0, 1, body[:half], first_pad)
                      + _padded(DATA, END_STREAM, 1, body[half:], last_pad))
    seen = await peer.until(HEADERS, 1) + await peer.until(HEADERS, 1)
    answer = b"".join(f[3] for f in seen if f[0] == DATA)
    assert hookapi.ContainerResourceHookResponse.FromString(answer[5:]).container_annotations["echo"] == "yyyyy"
    assert dict(peer.decoder.decode(seen[-1][3])) == {"grpc-status": "0"}
    await peer.close()
