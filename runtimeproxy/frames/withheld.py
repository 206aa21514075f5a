"""The client's header blocks the runtime must not get, and how its HPACK
decoder stays right without them.

A client may send trailers (a header block with END_STREAM) on a stream the
runtime no longer has open: one the proxy ended (a refusal, a reset; RFC 9113
5.1: the client may have sent them before it read that end, and they are to
be ignored), one the runtime ended, or a call the proxy answers itself
(diverted, hooked). Recent grpc-go (containerd 1.7's; 1.6's ignores it) ends
its whole connection on any header block on a stream it has seen
(``received an illegal stream id``), every call kubelet has on it with it. So
such a block is read by the proxy (its own decoder stays in step with the
client's encoder) and never passed on.

The runtime's decoder then never reads it. A block that left the table as it
was (most trailers: ``grpc-status``-like fields the client has indexed, or
literals without indexing) changes nothing there. One that changed it (a new
entry, a size update) leaves the runtime's table behind the client's for good:
from then on the connection's blocks reach the runtime *restated*, each
header written from HPACK's static table or as a literal without indexing
(never indexed if the client's was: hpackstatic.py), which neither reads
nor changes the runtime's dynamic table, so what it holds no longer matters.
The size updates a block starts with still go first (the runtime's decoder
may require them), and so do those of the blocks dropped since the last one
passed on: once the runtime lowered its HEADER_TABLE_SIZE, the client's next
block must say the table shrank (RFC 7541 4.2), and a decoder that holds it
to that (Python's hpack does) ends the connection (COMPRESSION_ERROR) on a
block without it. The smallest size of the interval goes first, then the
last if it differs, as 4.2 asks of an encoder. A dropped size update forces
restating even when the table ends as it was (no entries, back to its size).

What a header block with END_STREAM on a stream id at or below the latest
the client opened, and not relayed and open here, gets:

* an id the client skipped (never opened, closed by a later one, RFC 9113
  5.1.1): a connection error, PROTOCOL_ERROR, as a HEADERS frame opening a
  stream below the latest is. The skipped ids are kept as ranges
  (``Skipped``, noted as a stream opens: nothing per frame); gRPC clients
  skip none, so for them it stays empty. Past SKIPPED_KEPT ranges (a client
  skipping every other id) the oldest are forgotten, and a block on one of
  those is dropped as below.
* a call the proxy takes (diverted, hooked) whose request had ended (the
  client's END_STREAM read; half-closed (remote), 5.1): a stream error,
  STREAM_CLOSED, as DATA after the request's end is (taken.py).
* a taken call whose request is still open: on a diverted call the block
  ends the request (the proxy's server gets it whole; the block's headers
  go nowhere); on a hooked call not answered yet it ends the call,
  INTERNAL ('request trailers on a hooked call': gRPC clients send none);
  on a hooked call answered, it is dropped, as below.
* any other (a stream the proxy ended, one the runtime ended, one long
  over): dropped, read only. Such a stream is closed, where 5.1 has
  frames after a RST_STREAM the endpoint sent ignored and lets the others
  be (a connection error is a MAY).
  Telling late trailers from a second end would take every stream's
  history: ``ended`` keeps only the latest ENDED_KEPT, and a relayed
  stream's END_STREAM passes in a verbatim run unread (reading it would cost
  every DATA frame). Dropped, such a block still keeps the proxy's decoder
  in step and never reaches the runtime: only an error report is lost.

On a relayed stream that is open, a block passes to the runtime, which
judges it (half-closed or not) as it would a direct client's. A block
without END_STREAM on an id not open here is refused (upstream._new_stream).
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
from hpack.hpack import decode_integer

from . import frame as fr
from . import hpackstatic, taken
from .frame import ErrorCode, FrameError
from .hpackpeek import HeaderReader

if TYPE_CHECKING:
    from .upstream import ClientSide

log = logging.getLogger(__name__)

SKIPPED_KEPT = 1024  # ranges of stream ids the client skipped, remembered per connection


@dataclass
class Skipped:
    """The stream ids a client skipped (RFC 9113 5.1.1: closed, never open),
    as ranges in the order they were skipped, which is the ids' own."""

    firsts: list[int] = field(default_factory=list)
    lasts: list[int] = field(default_factory=list)

    def note(self, first: int, last: int) -> None:
        """The client opened ``last`` + 2 after ``first`` - 2: the ids between were skipped."""
        self.firsts.append(first)
        self.lasts.append(last)
        if len(self.firsts) > SKIPPED_KEPT:  # the oldest forgotten (a block on them is dropped)
            del self.firsts[: SKIPPED_KEPT // 2], self.lasts[: SKIPPED_KEPT // 2]

    def __contains__(self, sid: int) -> bool:
        i = bisect_right(self.firsts, sid) - 1
        return i >= 0 and sid <= self.lasts[i]


@dataclass
class Restating:
    """A connection whose client blocks reach the runtime restated (from the
    first dropped block that changed the HPACK table on), and the size
    updates of dropped blocks not passed on yet (their smallest and last)."""

    sizes: list[int] = field(default_factory=list)

    def dropped(self, sizes: list[int]) -> None:
        if sizes:
            self.sizes = _smallest_and_last(self.sizes + sizes)

    def restate(self, stream_id: int, block: bytes, headers: list[tuple[bytes, bytes]], max_frame: int,
                end_stream: bool) -> list[bytes]:
        """``restated``, with the dropped blocks' size updates, which go this once."""
        dropped, self.sizes = self.sizes, []
        return restated(stream_id, block, headers, max_frame, end_stream, dropped)


def late_block(side: ClientSide, sid: int, data: bytes, end_stream: bool, out: list[bytes | memoryview]) -> None:
    """A header block on a stream the runtime does not have open (ended, or a
    call the proxy takes), ``out`` what goes to the runtime before it: read,
    never passed on; trailers on a stream that is over are ignored (RFC 9113 5.1)."""
    conn = side.conn
    if sid in side.skipped:  # never opened: nothing can come late on it
        raise FrameError(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {sid}, which the client skipped")
    changed = withhold(side.headers, data)
    sizes = _size_updates(data)[1]
    if (changed or sizes) and side.restating is None:
        side.restating = Restating()
        log.info("frames: a client's header block kept from the runtime changed the HPACK table; "
                 "the client's later blocks reach the runtime restated",
                 extra={"stream": sid, **conn.identity})
    if side.restating is not None:
        side.restating.dropped(sizes)
    if sid in conn.ended:
        return
    if taken.request_closed(conn, sid):
        side.stream_error(sid, out, ErrorCode.STREAM_CLOSED)
        return
    diverted = conn.diverted.get(sid)
    held = conn.hooked.get(sid)
    if diverted is not None:
        if end_stream:
            diverted.ended.set()
    elif held is not None and not held.answered.done():  # gRPC clients send no request trailers; nor may anyone here
        side.write_backend(out)
        conn.end_hooked(sid, grpc.StatusCode.INTERNAL, "runtime-proxy: request trailers on a hooked call")


def withhold(reader: HeaderReader, block: bytes) -> bool:
    """Read ``block`` (kept from the runtime) into the client's table: whether the table changed."""
    before = reader.table_state()
    reader.decode(block)  # a malformed block is still a connection error (COMPRESSION_ERROR)
    return reader.table_state() != before


def restated(stream_id: int, block: bytes, headers: list[tuple[bytes, bytes]], max_frame: int,
             end_stream: bool, dropped: list[int] | None = None) -> list[bytes]:
    """``block`` (whose ``headers`` were read) as frames that leave the
    runtime's dynamic table alone, after the size updates of ``dropped``
    blocks (their smallest and last) merged with its own."""
    length, sizes = _size_updates(block)
    if dropped:
        updates = b"".join(hpackstatic.integer(size, 5, 0x20) for size in _smallest_and_last(dropped + sizes))
    else:
        updates = block[:length]
    return fr.header_frames(stream_id, updates + hpackstatic.stateless_block(headers), max_frame, end_stream)


def _size_updates(block: bytes) -> tuple[int, list[int]]:
    """The length of the dynamic table size updates ``block`` starts with (RFC 7541 4.2), and their sizes."""
    view = memoryview(block)
    i = 0
    sizes = []
    while i < len(block) and block[i] & 0xE0 == 0x20:
        size, used = decode_integer(view[i:], 5)
        sizes.append(size)
        i += used
    return i, sizes


def _smallest_and_last(sizes: list[int]) -> list[int]:
    smallest = min(sizes)
    return [smallest] if smallest == sizes[-1] else [smallest, sizes[-1]]
