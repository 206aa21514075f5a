"""A client connection spliced as bytes to the proxy's own grpc.aio server,
told to go away once the runtime can be reached again.

A connection that comes while the runtime cannot be dialled (killed,
restarting) or its versions are not known yet is spliced to the proxy's own
server (listener.py), which answers as the grpc data path would. kubelet
keeps a connection as long as it works: untold, it would stay on that path
after the runtime is back, at several times a relayed call's CPU, until the
proxy or kubelet restarts. So when the runtime is back, the splice writes the
client a GOAWAY (NO_ERROR, last stream 2^31-1: every stream it opened is still
served) between two of the server's frames, outside a header block (a
HEADERS or PUSH_PROMISE frame without END_HEADERS must be followed directly
by its CONTINUATION frames, RFC 9113 6.10): the client opens its next calls
on a new connection, relayed, and closes this one once its calls are done.
The server's bytes are only walked frame by frame for that, never changed.
"""

from __future__ import annotations

import asyncio

from . import frame as fr

# The highest stream id there is: the GOAWAY refuses no stream the client opened.
_GOAWAY = fr.goaway(fr.MAX_STREAM_ID, fr.ErrorCode.NO_ERROR, b"runtime-proxy: the runtime is back; reconnect")


class Splice:
    """The server-to-client half of a spliced connection (the other half is a plain copy)."""

    def __init__(self, client: asyncio.WriteTransport) -> None:
        self._client = client
        self._head = bytearray()  # a frame header read in part
        self._left = 0  # payload bytes of the current frame still to come
        self._in_block = False  # in a header block: its CONTINUATION frames come next
        self._framed = False  # a whole frame went by: the server's preface (SETTINGS) is out
        self._wanted = False  # go away at the next frame boundary
        self._done = False  # our GOAWAY written, or the server's own seen: walk no more

    def from_server(self, data: bytes) -> None:
        if not self._done:
            cut = self._walk(data)
            if cut is not None:
                self._client.write(data[:cut])
                self._send()
                data = data[cut:]
        if data:
            self._client.write(data)

    def go_away(self) -> None:
        """Tell the client to reconnect: now if between two frames outside a
        header block, else at the next such boundary."""
        if self._done:
            return
        if self._framed and not self._left and not self._head and not self._in_block:
            self._send()
        else:
            self._wanted = True

    def _send(self) -> None:
        self._done = True
        if not self._client.is_closing():
            self._client.write(_GOAWAY)

    def _walk(self, data: bytes) -> int | None:
        """Follow ``data``'s frames; the first boundary in it, outside a header
        block, at which the GOAWAY is wanted, or None (the state then stands
        at its end)."""
        pos, end = 0, len(data)
        while pos < end:
            if self._left:
                step = min(self._left, end - pos)
                pos += step
                self._left -= step
            else:
                need = fr.HEADER_LEN - len(self._head)
                self._head += data[pos:pos + need]
                pos = min(pos + need, end)
                if len(self._head) < fr.HEADER_LEN:
                    return None
                self._left = int.from_bytes(self._head[:3], "big")
                kind, flags = self._head[3], self._head[4]
                # A frame inside a header block would be a connection error for the client.
                self._in_block = fr.leaves_block_open(kind, flags)
                if kind == fr.FrameType.GOAWAY:
                    # Going away itself: a GOAWAY of ours after its own would
                    # raise its last stream, which the client takes as an error.
                    self._done = True
                    return None
                self._head.clear()
            if not self._left and not self._head and not self._in_block:
                self._framed = True
                if self._wanted:
                    return pos
        return None
