"""A no-op hook server on raw HTTP/2 frames: the benchmark's stand-in for a cheap hook server.

    python -m bench.leanhook SOCKET

The SDK's server (``hooks.testserver``, grpc.aio) spends about 0.9 ms of CPU
per call on these 2-core machines, and that CPU is taken from the runtime
and the proxy while a pod starts. A hook server in a compiled language
(Koordinator's koordlet, in Go) costs a small part of that. This one answers
every hook method with an empty response for about a quarter of the SDK's
CPU, so a hooked lifecycle measured with both tells the proxy's cost from
its hook server's. It is a benchmark tool, not an SDK: it never decodes a
message (a no-op answers the same whatever comes).

The HTTP/2 it speaks is enough for gRPC clients, and correct where it
speaks: its own DATA waits for the peer's windows, what it receives is given
back in WINDOW_UPDATEs (connection and stream), PING and SETTINGS are
acknowledged, the peer's header table size is kept, a peer's GOAWAY lets the
open calls finish, and a protocol error ends the connection with a GOAWAY
carrying the error's code. Any method but the seven hook methods answers
UNIMPLEMENTED. It never pushes back on a slow reader (its answers are 40
bytes a call).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import struct
import sys
from collections import deque
from pathlib import Path
from typing import cast

import hpack

from runtimeproxy import eventloop
from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import ErrorCode, Flag, FrameError, FrameType, Setting
from runtimeproxy.hookpath.points import HOOK_POINTS
from runtimeproxy.host import unixsocket

__all__ = ["HOOK_PATHS", "serve", "start"]

HOOK_PATHS = frozenset(point.full_method.encode() for point in HOOK_POINTS.values())
EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"  # uncompressed, length 0: every hook response with no field set
# What it lets a peer send before a WINDOW_UPDATE (given back after every read): 16 MiB, the
# largest hook request, in one go.
RECEIVE_WINDOW = 16 * 1024 * 1024
_HPACK_DEFAULT_TABLE = 4096
MAX_HEADER_BLOCK = 64 * 1024  # a header block longer than this is a peer gone wrong
_RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
_UNIMPLEMENTED = [*_RESPONSE_HEADERS, (b"grpc-status", b"12"), (b"grpc-message", b"not a hook method")]


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._preface = False
        self._decoder = hpack.Decoder()
        self._encoder = hpack.Encoder()
        self._open: dict[int, bool] = {}  # stream id -> is a hook method, until answered
        self._last_stream = 0
        self._block: tuple[int, bytearray, bool] | None = None  # a header block awaiting CONTINUATION
        self._unacked = 0  # DATA bytes received and not yet given back (connection)
        self._stream_unacked: dict[int, int] = {}  # the same per open stream, within one read
        self._going_away = False  # the peer sent GOAWAY: close once its open calls are answered
        # The peer's windows for what this side sends: one message of 5 bytes per call.
        self._initial_window = fr.DEFAULT_WINDOW
        self._conn_window = fr.DEFAULT_WINDOW
        self._windows: dict[int, int] = {}  # stream id -> its window, from its open to its message
        self._waiting: deque[int] = deque()  # streams whose message waits for a window
        self._out: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport = transport
        settings = struct.pack(">HI", Setting.INITIAL_WINDOW_SIZE, RECEIVE_WINDOW)
        transport.write(fr.serialize(FrameType.SETTINGS, 0, 0, settings)
                        + fr.window_update(0, RECEIVE_WINDOW - fr.DEFAULT_WINDOW))

    def data_received(self, data: bytes) -> None:
        self._buf += data
        try:
            self._parse()
        except FrameError as exc:
            self._fail(exc.code, str(exc))
            return
        except hpack.HPACKError as exc:
            self._fail(ErrorCode.COMPRESSION_ERROR, f"bad header block: {exc}")
            return
        if self._unacked:
            self._out.append(fr.window_update(0, self._unacked))
            self._unacked = 0
        for sid, count in self._stream_unacked.items():
            if sid in self._open:  # a stream still receiving its request
                self._out.append(fr.window_update(sid, count))
        self._stream_unacked.clear()
        self._flush()
        if self._going_away and not self._open and not self._waiting:
            self._close()

    def _parse(self) -> None:
        if not self._preface:
            if len(self._buf) < len(fr.PREFACE):
                if not fr.PREFACE.startswith(bytes(self._buf)):
                    raise FrameError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if bytes(self._buf[: len(fr.PREFACE)]) != fr.PREFACE:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            del self._buf[: len(fr.PREFACE)]
            self._preface = True
        pos = 0
        while self._transport is not None:
            frame, end = fr.parse(self._buf, pos, fr.DEFAULT_MAX_FRAME)
            if frame is None:
                break
            self._on_frame(frame)
            pos = end
        frame = None  # its payload is a view of the buffer, which cannot shrink while it lives
        del self._buf[:pos]

    def _on_frame(self, frame: fr.Frame) -> None:
        kind, sid = frame.type, frame.stream_id
        if self._block is not None and kind != FrameType.CONTINUATION:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "header block interrupted")
        if kind == FrameType.HEADERS:
            self._block = (sid, bytearray(fr.unpadded(frame)), frame.has(Flag.END_STREAM))
            self._header_fragment(frame)
        elif kind == FrameType.CONTINUATION:
            if self._block is None or self._block[0] != sid:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            self._block[1].extend(frame.payload)
            self._header_fragment(frame)
        elif kind == FrameType.DATA:
            self._unacked += len(frame.payload)
            if sid in self._open:
                if frame.has(Flag.END_STREAM):
                    self._answer(sid)
                elif frame.payload:
                    self._stream_unacked[sid] = self._stream_unacked.get(sid, 0) + len(frame.payload)
        elif kind == FrameType.SETTINGS:
            if not frame.has(Flag.ACK):
                self._settings(fr.settings(frame.payload))
                self._out.append(fr.serialize(FrameType.SETTINGS, Flag.ACK, 0))
        elif kind == FrameType.WINDOW_UPDATE:
            increment = fr.window_increment(frame)
            if increment == 0:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, f"WINDOW_UPDATE of 0 on stream {sid}")
            if sid == 0:
                self._conn_window = _grown(self._conn_window, increment)
            elif sid in self._windows:
                self._windows[sid] = _grown(self._windows[sid], increment)
        elif kind == FrameType.PING:
            if len(frame.payload) != 8:
                raise FrameError(ErrorCode.FRAME_SIZE_ERROR, f"PING of {len(frame.payload)} bytes, not 8")
            if not frame.has(Flag.ACK):
                self._out.append(fr.serialize(FrameType.PING, Flag.ACK, 0, bytes(frame.payload)))
        elif kind == FrameType.RST_STREAM:
            self._open.pop(sid, None)
            self._windows.pop(sid, None)
        elif kind == FrameType.GOAWAY:
            self._going_away = True

    def _header_fragment(self, frame: fr.Frame) -> None:
        assert self._block is not None
        sid, block, end_stream = self._block
        if len(block) > MAX_HEADER_BLOCK:
            raise FrameError(ErrorCode.ENHANCE_YOUR_CALM, f"header block over {MAX_HEADER_BLOCK} bytes")
        if not frame.has(Flag.END_HEADERS):
            return
        self._block = None
        headers = self._decoder.decode(bytes(block), raw=True)  # decoded always: HPACK state must follow
        if sid not in self._open:  # a new call (a known stream's second block is its trailers)
            if sid % 2 == 0 or sid <= self._last_stream:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {sid}, not a new client stream")
            if self._going_away:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, f"stream {sid} opened after the peer's GOAWAY")
            self._last_stream = sid
            path = next((value for name, value in headers if name == b":path"), b"")
            self._open[sid] = path in HOOK_PATHS
            self._windows[sid] = self._initial_window
        if end_stream:
            self._answer(sid)

    def _settings(self, values: dict[int, int]) -> None:
        table = values.get(Setting.HEADER_TABLE_SIZE)
        if table is not None:  # the peer's decoder holds this much: the encoder stays within it
            self._encoder.header_table_size = min(table, _HPACK_DEFAULT_TABLE)
        window = values.get(Setting.INITIAL_WINDOW_SIZE)
        if window is None:
            return
        if window > fr.MAX_WINDOW:
            raise FrameError(ErrorCode.FLOW_CONTROL_ERROR, f"INITIAL_WINDOW_SIZE {window} over 2^31-1")
        delta, self._initial_window = window - self._initial_window, window
        for sid in self._windows:  # RFC 9113 section 6.9.2: open streams' windows move with it
            self._windows[sid] = _grown(self._windows[sid], delta)

    def _answer(self, sid: int) -> None:
        if not self._open.pop(sid):
            del self._windows[sid]
            self._out.append(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, sid,
                                          self._encoder.encode(_UNIMPLEMENTED)))
            return
        self._out.append(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid,
                                      self._encoder.encode(_RESPONSE_HEADERS)))
        self._waiting.append(sid)

    def _flush(self) -> None:
        # Each waiting message goes once its stream's and the connection's windows allow, in call
        # order; one whose stream window is shut does not hold up the others.
        still: deque[int] = deque()
        for sid in self._waiting:
            window = self._windows.get(sid)
            if window is None:  # reset meanwhile
                continue
            if min(window, self._conn_window) < len(EMPTY_MESSAGE):
                still.append(sid)
                continue
            del self._windows[sid]
            self._conn_window -= len(EMPTY_MESSAGE)
            self._out.append(fr.serialize(FrameType.DATA, 0, sid, EMPTY_MESSAGE))
            self._out.append(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, sid,
                                          self._encoder.encode([(b"grpc-status", b"0")])))
        self._waiting = still
        if self._out and self._transport is not None:
            self._transport.write(b"".join(self._out))
        self._out.clear()

    def _fail(self, code: ErrorCode, message: str) -> None:
        if self._transport is not None:
            self._transport.write(fr.goaway(self._last_stream, code, message.encode()[:256]))
        self._close()

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


def _grown(window: int, delta: int) -> int:
    """A send window after a WINDOW_UPDATE or a SETTINGS change; past 2^31-1 is the peer's error."""
    window += delta
    if window > fr.MAX_WINDOW:
        raise FrameError(ErrorCode.FLOW_CONTROL_ERROR, f"flow-control window past 2^31-1 ({window})")
    return window


async def start(socket_path: Path) -> asyncio.AbstractServer:
    """Listen on ``socket_path`` (a stale socket file is replaced, a live one refused)."""
    unixsocket.prepare(socket_path)
    return await asyncio.get_running_loop().create_unix_server(_Connection, str(socket_path))


async def serve(socket_path: Path) -> None:
    """Serve until SIGTERM or SIGINT; "ready" is printed once listening."""
    server = await start(socket_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    identity = unixsocket.SocketIdentity.of(socket_path)
    print("ready", flush=True)
    async with server:
        await stop.wait()
    unixsocket.remove_own(socket_path, identity)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.leanhook", description=__doc__.split("\n")[0])
    parser.add_argument("socket", type=Path, help="unix socket path to listen on")
    args = parser.parse_args(argv)
    try:
        eventloop.run(serve(args.socket.absolute()), "auto")
    except unixsocket.UnixSocketError as exc:
        print(f"leanhook: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
