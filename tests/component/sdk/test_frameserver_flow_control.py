"""The SDK's frames transport (hooks.frameserver) and HTTP/2 flow control, against
hand-driven HTTP/2 peers: stream and connection windows, the peer's frame size, and
peers that do not read or write before they read.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from cri_api.hookapi import api_pb2 as hookapi
from hooks.frameserver import connection, sending

from ..rawh2 import (
    DATA, END_STREAM, HEADERS, PING, WINDOW_UPDATE, frame, grpc_call, open_call, raw_with_settings,
)
from . import scriptedserver
from .scriptedserver import LIMIT, PRE_CREATE, Scripted, hook_request_bytes

frames = scriptedserver.frames  # the fixture, here for pytest to find


async def test_a_shut_stream_window_holds_only_its_own_answer(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path), (0x4, 0))  # INITIAL_WINDOW_SIZE = 0
    peer.writer.write(grpc_call(1, PRE_CREATE.full_method, hook_request_bytes("5"))
                      + grpc_call(3, PRE_CREATE.full_method, hook_request_bytes("6")))
    await peer.until(HEADERS, 3)  # both answers' headers come; their DATA waits
    peer.writer.write(frame(WINDOW_UPDATE, 0, 3, struct.pack(">I", 1 << 16)))
    seen = await peer.until(HEADERS, 3)  # stream 3's trailers
    assert not [f for f in seen if f[0] == DATA and f[2] == 1]
    assert dict(peer.decoder.decode(seen[-1][3])) == {"grpc-status": "0"}
    peer.writer.write(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 16)))
    rest = await peer.until(HEADERS, 1)
    body = b"".join(f[3] for f in rest if f[0] == DATA and f[2] == 1)
    answer = hookapi.ContainerResourceHookResponse.FromString(body[5:])
    assert answer.container_annotations["echo"] == "yyyyy"
    await peer.close()


async def test_the_connection_window_comes_back_in_batches_not_per_small_call(frames: Scripted) -> None:
    """A small call's answer is all the server writes for it (no WINDOW_UPDATE to wake the
    client for); the connection's window comes back once CREDIT_BATCH of it was used."""
    from hooks.frameserver.settings import CREDIT_BATCH

    peer = await raw_with_settings(Path(frames.socket_path))
    for stream in (1, 3):  # the first answer follows the server's SETTINGS and window grant
        peer.writer.write(grpc_call(stream, PRE_CREATE.full_method, hook_request_bytes("5")))
        seen = await peer.until(HEADERS, stream) + await peer.until(HEADERS, stream)
    assert [f[0] for f in seen] == [HEADERS, DATA, HEADERS]
    message = hook_request_bytes("none", pad=CREDIT_BATCH // 8)  # a large request, an empty answer
    body = b"\x00" + struct.pack(">I", len(message)) + message
    chunks = [body[i:i + 16384] for i in range(0, len(body), 16384)]
    stream, updates = 5, []
    while not updates:  # calls until CREDIT_BATCH of the window is used
        peer.writer.write(open_call(stream, PRE_CREATE.full_method) + b"".join(
            frame(DATA, END_STREAM if chunk is chunks[-1] else 0, stream, chunk) for chunk in chunks))
        seen = await peer.until(HEADERS, stream) + await peer.until(HEADERS, stream)
        updates = [f for f in seen if f[0] == WINDOW_UPDATE and f[2] == 0]
        stream += 2
        assert stream < 40
    assert struct.unpack(">I", updates[0][3])[0] >= CREDIT_BATCH
    await peer.close()


async def test_answers_are_framed_at_the_peers_max_frame_size(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path), (0x5, 40_000))  # MAX_FRAME_SIZE
    peer.writer.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)))
    peer.writer.write(open_call(1, PRE_CREATE.full_method) + frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 20)))
    message = hook_request_bytes("100000")
    peer.writer.write(frame(DATA, END_STREAM, 1, b"\x00" + struct.pack(">I", len(message)) + message))
    frames_seen = await peer.until(HEADERS, 1) + await peer.until(HEADERS, 1)
    sizes = [len(f[3]) for f in frames_seen if f[0] == DATA]
    assert max(sizes) == 40_000 and sum(sizes) > 100_000
    await peer.close()


async def test_a_peer_that_does_not_read_is_not_read_either(frames: Scripted, sock_dir: Path) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    pings = frame(PING, 0, 0, b"12345678") * 65_536  # 1.1 MiB of PINGs, each answered by an ACK
    with pytest.raises(TimeoutError):
        for _ in range(64):
            peer.writer.write(pings)
            await asyncio.wait_for(peer.writer.drain(), 2)
    (conn,) = frames._server._connections  # type: ignore[union-attr]
    assert conn._transport.get_write_buffer_size() < 2 << 20  # its ACKs wait in the socket, not here
    peer.writer.transport.abort()


async def test_a_peer_that_writes_before_it_reads_is_still_read(frames: Scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    # An answer fills the server's write buffer while the client, reading later, sends its next request:
    # that answer's DATA is not control backlog, and the request must still be read.
    monkeypatch.setattr(sending, "CONTROL_BACKLOG", 100_000)
    paused = asyncio.Event()
    pause_writing = connection.Connection.pause_writing

    def note_pause(self: connection.Connection) -> None:
        pause_writing(self)
        paused.set()

    monkeypatch.setattr(connection.Connection, "pause_writing", note_pause)
    peer = await raw_with_settings(Path(frames.socket_path), (0x4, 32 << 20))
    peer.writer.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 32 << 20))
                      + grpc_call(1, PRE_CREATE.full_method, hook_request_bytes(str(LIMIT - 200))))
    await asyncio.wait_for(paused.wait(), 5)
    message = hook_request_bytes("1", pad=900_000)
    body = b"\x00" + struct.pack(">I", len(message)) + message
    chunks = [body[i:i + 16_000] for i in range(0, len(body), 16_000)]
    peer.writer.write(open_call(3, PRE_CREATE.full_method)
                      + b"".join(frame(DATA, END_STREAM if i == len(chunks) - 1 else 0, 3, c) for i, c in enumerate(chunks)))
    await asyncio.wait_for(peer.writer.drain(), 5)
    answers = {1: b"", 3: b""}
    while True:
        f = await peer.read()
        assert f is not None
        if f[0] == DATA:
            answers[f[2]] += f[3]
        elif f[0] == HEADERS:
            peer.decoder.decode(f[3])
            if f[1] & END_STREAM and f[2] == 3:
                break
    assert len(hookapi.ContainerResourceHookResponse.FromString(answers[3][5:]).container_annotations["echo"]) == 1
    peer.writer.transport.abort()
