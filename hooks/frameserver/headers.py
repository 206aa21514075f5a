"""The header blocks of a hook call: the request's as they come, the answer's as they go.

A request's block comes as a HEADERS frame and the CONTINUATIONs of its
stream that follow it, up to the one with END_HEADERS (RFC 9113 section
4.3): held together here within MAX_HEADER_LIST, then read with the peer's
HPACK state followed (every block moves the decoder's table: a request's,
its trailers, a late one of a closed stream). What a stream does with them
is the connection's. An answer's blocks are the status: ``:status`` 200 and
the content-type, then ``grpc-status`` (and ``grpc-message``).
(The proxy's side of the same: ``runtimeproxy.hookclient.headers``.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import grpc
import hpack

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.divert import parse_timeout, percent_encode
from runtimeproxy.frames.frame import ErrorCode, Flag, FrameError
from runtimeproxy.frames.hpackpeek import CACHED_BLOCK_BYTES, CACHED_BLOCKS, peek_all
from runtimeproxy.frames.hpackstatic import stateless_block

from .calls import ACCEPTED_ENCODINGS, Route
from .settings import MAX_HEADER_LIST

Headers = list[tuple[bytes, bytes]]
# What a call takes from its request's headers: route, grpc-timeout, grpc-encoding, and the HTTP status refusing it.
RequestHead = tuple[Route | None, float | None, bytes, bytes | None]


@dataclass(slots=True, eq=False)
class Read:
    """A block as read: its headers (the last of each name), and what a call
    takes from them once worked out (``head``, the connection's). A remembered
    block is handed back as this same object, never changed, so each distinct
    block is worked out once, however the blocks of a connection alternate."""

    headers: dict[bytes, bytes]
    head: RequestHead | None = None


# A whole block: its stream, its headers as read and the HEADERS frame's END_STREAM.
Block = tuple[int, Read, bool]

OK_HEADERS: Headers = [(b":status", b"200"), (b"content-type", b"application/grpc"),
                       (b"grpc-accept-encoding", ACCEPTED_ENCODINGS)]
OK_HEADERS_BLOCK = stateless_block(OK_HEADERS)  # every answer's first block: no encoder work
OK_TRAILERS: Headers = [(b"grpc-status", b"0")]
OK_TRAILERS_BLOCK = stateless_block(OK_TRAILERS)
# A status message's encoded bytes at most: well within grpc's 8 KiB of
# metadata (a longer one fails the call at the client, or its connection).
MAX_STATUS_MESSAGE = 4096
# Read for every block: module globals, not attributes of Flag (a class of ints) or fr.
_WHOLE_PLAIN, _END_HEADERS, _END_STREAM = fr.WHOLE_PLAIN, Flag.END_HEADERS, Flag.END_STREAM


class HeaderBlocks:
    """A connection's incoming blocks, each read once whole.

    The proxy's request blocks carry no HPACK state (hookclient/headers.py:
    the static table and literals it never indexes), and repeat: a method's
    block differs only in its ``grpc-timeout``, nearly always the same
    milliseconds. While the decoder's table is empty, such a block reads the
    same each time and leaves the table empty: what it read is remembered
    (for the table's size at the time, which a size update may change), and
    a block seen again costs a lookup, not a read, and comes back as the same
    ``Read``, with what the connection worked out from it the first time. A
    block that fills the table, or comes once it is filled, is read every
    time."""

    def __init__(self) -> None:
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = MAX_HEADER_LIST
        self._stateless: dict[bytes, Read] = {}  # shared answers, with their heads: never changed
        self._stateless_size = self._decoder.header_table.maxsize  # the table's size they were read at
        self._pending: tuple[int, bytearray, bool] | None = None  # a block awaiting CONTINUATION

    def allow_table_size(self, size: int) -> None:
        """The peer's encoder may use ``size`` bytes of table (this side's
        SETTINGS_HEADER_TABLE_SIZE, once acknowledged; the server announces
        none). What was remembered is forgotten: it was read where a block
        could keep a larger table, which the reader refuses once not allowed."""
        if size != self._decoder.max_allowed_table_size:
            self._decoder.max_allowed_table_size = size
            self._stateless.clear()

    @property
    def open(self) -> bool:
        """A block waits for its CONTINUATION: no other frame may come between."""
        return self._pending is not None

    def headers(self, frame: fr.Frame) -> Block | None:
        """A HEADERS frame: its block, or None until its last CONTINUATION."""
        sid, flags = frame.stream_id, frame.flags
        if sid == 0:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & _WHOLE_PLAIN == _END_HEADERS:  # whole, nothing to strip (nearly every block): not put together
            # One frame is within MAX_HEADER_LIST: it is at most DEFAULT_MAX_FRAME (this side announces no other).
            return sid, self._read(bytes(frame.payload)), bool(flags & _END_STREAM)
        self._pending = (sid, bytearray(fr.unpadded(frame)), bool(flags & _END_STREAM))
        return self._fragment(frame)

    def continuation(self, frame: fr.Frame) -> Block | None:
        if self._pending is None or self._pending[0] != frame.stream_id:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self._pending[1].extend(frame.payload)
        return self._fragment(frame)

    def _fragment(self, frame: fr.Frame) -> Block | None:
        assert self._pending is not None
        sid, block, end_stream = self._pending
        if len(block) > MAX_HEADER_LIST:
            raise FrameError(ErrorCode.ENHANCE_YOUR_CALM, f"header block over {MAX_HEADER_LIST} bytes")
        if not frame.flags & _END_HEADERS:
            return None
        self._pending = None
        return sid, self._read(bytes(block)), end_stream

    def _read(self, block: bytes) -> Read:
        table = self._decoder.header_table
        stateless = not table.dynamic_entries
        if stateless:
            if table.maxsize != self._stateless_size:
                self._stateless.clear()
                self._stateless_size = table.maxsize
            known = self._stateless.get(block)
            if known is not None:
                return known
        # Read without a full decode where it can be (hpackpeek), else decoded in full.
        headers = peek_all(self._decoder, block)
        if headers is None:
            try:
                return Read(dict(self._decoder.decode(block, raw=True)))  # raw: a -bin value may be true binary
            except hpack.HPACKError as exc:
                raise FrameError(ErrorCode.COMPRESSION_ERROR, f"bad header block: {exc}") from exc
        read = Read(dict(headers))
        if stateless and not table.dynamic_entries and len(block) <= CACHED_BLOCK_BYTES:
            if len(self._stateless) >= CACHED_BLOCKS:
                self._stateless.clear()
            self._stateless[block] = read
        return read


def request_head(headers: dict[bytes, bytes], routes: Mapping[bytes, Route]) -> RequestHead:
    return (routes.get(headers.get(b":path", b"")), grpc_timeout(headers), headers.get(b"grpc-encoding", b"identity"),
            refusal(headers))


def refusal(headers: dict[bytes, bytes]) -> bytes | None:
    """The HTTP status answering a request that is not a gRPC call, or None (gRPC over HTTP/2, "Responses")."""
    if headers.get(b":method") != b"POST":
        return b"405"
    if not headers.get(b"content-type", b"").startswith(b"application/grpc"):
        return b"415"
    return None


def grpc_timeout(headers: dict[bytes, bytes]) -> float | None:
    """The call's grpc-timeout in seconds; None without one, or a malformed one (a call with no deadline)."""
    value = headers.get(b"grpc-timeout")
    return parse_timeout(value.decode("latin-1")) if value else None


def trailers_only(code: grpc.StatusCode, details: str) -> Headers:
    """The one block of an answer that ends the call without a message."""
    ending = [*OK_HEADERS, (b"grpc-status", str(code.value[0]).encode())]
    if details:
        ending.append((b"grpc-message", status_message(details)))
    return ending


def status_message(details: str) -> bytes:
    """``details`` as a grpc-message value, cut to MAX_STATUS_MESSAGE bytes."""
    encoded = percent_encode(details).encode()
    if len(encoded) <= MAX_STATUS_MESSAGE:
        return encoded
    suffix = b" ...(cut)"
    out, size = [], len(suffix)
    for char in details:  # whole characters: a cut never splits a %XX escape
        piece = percent_encode(char).encode()
        if size + len(piece) > MAX_STATUS_MESSAGE:
            break
        out.append(piece)
        size += len(piece)
    return b"".join(out) + suffix
