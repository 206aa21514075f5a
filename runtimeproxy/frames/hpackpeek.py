"""A few headers read out of an HPACK block, without the full decoder.

The relay needs one or two headers of each block (``:path`` of a request,
``grpc-status`` of an answer), and a full decode is a large part of what a
relayed call costs. Most blocks after the first few calls on a connection
only refer to the dynamic table, or add literals that are not indexed: for
those the wanted headers are read here and the rest skipped. A block that
adds to the table is read in full here, and its entries added once the whole
block has read well, exactly as the full decoder adds them: gRPC clients
index each new ``grpc-timeout`` value, and grpc-go writes a deadline under
100 s in microseconds, a new value each call. An index into the table after
an entry the block adds (grpc-core's user-agent follows a new
``grpc-timeout``) is read in the table as those entries leave it. A block
this reader does not take (a size update, anything malformed) returns None
and leaves the table as it was: the caller then decodes it in full, which
keeps the table in step and reports malformed blocks. ``peek_all`` reads
every header the same way, for the calls the proxy handles itself.
``HeaderReader`` is one direction's decoder read that way, with what it
found remembered while the table stays as it was (``bench/headers.py``
times it).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import hpack
from hpack.hpack import decode_integer
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

from .frame import ErrorCode, FrameError


def peek(decoder: hpack.Decoder, block: bytes, wanted: frozenset[bytes]) -> dict[bytes, bytes] | None:
    """The ``wanted`` headers of ``block`` (the last of each name), or None
    (decode it in full; the table is as it was)."""
    read = _read(decoder, block, wanted)
    return None if read is None else {name: value for name, value in read[0] if name in wanted}


def peek_all(decoder: hpack.Decoder, block: bytes) -> list[tuple[bytes, bytes]] | None:
    """Every header of ``block``, in order, as ``decoder.decode(block, raw=True)``
    gives them (with the table changed as it would change it); or None (decode
    it in full), also when the list is longer than the decoder's
    ``max_header_list_size``, so that the full decoder refuses it."""
    read = _read(decoder, block, None)
    return None if read is None else read[0]


def _read(decoder: hpack.Decoder, block: bytes, wanted: frozenset[bytes] | None) -> tuple[list[_Header], bool] | None:
    """The headers read (the wanted ones and perhaps others; every one when
    ``wanted`` is None or the block adds to the table, which the caller then
    may not read again) and whether the table changed; None: decode it in full."""
    try:
        try:
            found = _peek(decoder, block, wanted)
        except _AddsToTable:  # read again in full: its headers can be read only once
            found = _peek(decoder, block, None)
    except Exception:  # noqa: BLE001 - whatever this reader cannot take, the full decoder judges
        return None
    if found is None:
        return None
    headers, added = found
    for name, value in added:  # only now: a block read halfway leaves the table as it was
        decoder.header_table.add(name, value)
    return headers, bool(added)


class _AddsToTable(Exception):
    """A block read for some of its headers adds to the table, and a value was
    skipped: read it again for all of them."""


_Header = tuple[bytes, bytes]
_STATIC_TABLE = HeaderTable.STATIC_TABLE
_STATIC = len(_STATIC_TABLE)  # 61: a higher index is the dynamic table's


def _peek(decoder: hpack.Decoder, block: bytes,
          wanted: frozenset[bytes] | None) -> tuple[list[_Header], list[_Header]] | None:
    """The headers read and the entries the block adds to the table, or None.

    With ``wanted``, the values of other literals are skipped (the headers
    then hold the wanted ones, and perhaps others) until the block adds an
    entry: from there every header is read, as with ``wanted`` None, or
    _AddsToTable is raised if a value was skipped already."""
    if decoder.header_table_size > decoder.max_allowed_table_size:
        return None  # the peer had to shrink its table first: the full decoder refuses the block
    static, dynamic = _STATIC_TABLE, decoder.header_table.dynamic_entries  # (an index past either: IndexError)
    found: list[_Header] = []
    pending: _Pending | None = None  # what the block adds, from its first add
    skipped = False
    room = decoder.max_header_list_size  # RFC 7541's size: name, value and 32 octets each
    view = memoryview(block)
    i, n = 0, len(block)
    while i < n:
        first = block[i]
        if first & 0x80:  # indexed field
            if first != 0xFF:  # the index fits in the first byte (nearly always)
                index = first & 0x7F
                i += 1
            else:
                index, used = decode_integer(view[i:], 7)
                i += used
            if index == 0:
                return None
            if index <= _STATIC:
                name, value = static[index - 1]
            elif pending is None:
                name, value = dynamic[index - _STATIC - 1]
            else:  # (grpc-core's user-agent, after a new grpc-timeout)
                name, value = pending.entry(index)
        elif first & 0xC0 == 0x40:  # a literal added to the table
            if wanted is not None:  # (a new grpc-timeout, after fields that refer to the table)
                if skipped:
                    raise _AddsToTable
                wanted = None
                room -= sum(len(name) + len(value) + 32 for name, value in found)
                if room < 0:
                    return None
            name, i = _literal_name(block, view, i, 6, dynamic, pending)
            value, i = _string(block, view, i)
            if pending is None:
                pending = _Pending(decoder.header_table)
            pending.add(name, value)
        elif first & 0xE0 == 0x20:  # resizes the table
            return None
        else:  # a literal without indexing (0000xxxx) or never indexed (0001xxxx)
            name, i = _literal_name(block, view, i, 4, dynamic, pending)
            if wanted is not None and name not in wanted:  # its value is skipped, not decoded
                length, used = decode_integer(view[i:], 7)
                i += used + length
                if i > n:
                    return None
                skipped = True
                continue
            value, i = _string(block, view, i)
        if wanted is None:
            room -= len(name) + len(value) + 32
            if room < 0:
                return None
        found.append((name, value))
    return found, ([] if pending is None else pending.entries)


def _literal_name(block: bytes, view: memoryview, i: int, prefix: int, dynamic: deque[_Header],
                  pending: _Pending | None) -> tuple[bytes, int]:
    """A literal field's name (an index in the first ``prefix`` bits, or a
    string after them), and where its value begins."""
    index, used = decode_integer(view[i:], prefix)
    if index:
        return _name(dynamic, pending, index), i + used
    return _string(block, view, i + used)


def _name(dynamic: deque[_Header], pending: _Pending | None, index: int) -> bytes:
    if index <= _STATIC:
        return _STATIC_TABLE[index - 1][0]
    if pending is None:
        return dynamic[index - _STATIC - 1][0]
    return pending.entry(index)[0]


class _Pending:
    """The entries a block adds, in order: the decoder's table gets them only
    once the whole block has read well. An index into the table after one of
    them is read in a copy of the table with them added (made at the first
    such index, then added to as the block goes): a block costs what its
    length does, however it interleaves adds and indexes."""

    __slots__ = ("table", "entries", "_after")

    def __init__(self, table: HeaderTable) -> None:
        self.table = table
        self.entries: list[_Header] = []
        self._after: HeaderTable | None = None

    def add(self, name: bytes, value: bytes) -> None:
        self.entries.append((name, value))
        if self._after is not None:
            self._after.add(name, value)

    def entry(self, index: int) -> _Header:
        """Dynamic entry ``index`` (an HPACK index, past the static table) as the adds so far leave the table."""
        after = self._after
        if after is None:
            after = self._after = HeaderTable()
            after.maxsize = self.table.maxsize
            after.dynamic_entries = deque(self.table.dynamic_entries)
            # hpack's own count, which its add evicts by (tests/unit/frames/test_hpackpeek.py);
            # without it, AttributeError: the block is left to the full decoder.
            after._current_size = self.table._current_size
            for name, value in self.entries:
                after.add(name, value)
        return after.dynamic_entries[index - _STATIC - 1]


def _string(block: bytes, view: memoryview, i: int) -> tuple[bytes, int]:
    huffman = block[i] & 0x80
    length, used = decode_integer(view[i:], 7)
    start = i + used
    end = start + length
    if end > len(block):
        raise ValueError("string past the end of the block")
    data = bytes(view[start:end])
    return (decode_huffman(data) if huffman else data), end


CACHED_BLOCKS = 256  # blocks remembered per set of wanted names, at most (then forgotten, and peeked again)
CACHED_BLOCK_BYTES = 256  # a longer block is peeked each time: the ones that repeat are a few bytes


def _remember(seen: dict[bytes, Any], block: bytes, found: Any) -> None:
    """Keep what ``block`` read as, if it is small; a full memo starts over (bounded memory)."""
    if len(block) <= CACHED_BLOCK_BYTES:
        if len(seen) >= CACHED_BLOCKS:
            seen.clear()
        seen[block] = found


class HeaderReader:
    """One direction's HPACK state, read the cheapest way that keeps it exact.

    A gRPC peer sends the same bytes for the same headers once its dynamic
    table holds them (each call's block of a method, each answer's status):
    what ``peek`` and ``peek_all`` found in a block is remembered until the
    table changes (a block that adds to it, a full ``decode``, a new size
    limit)."""

    def __init__(self, max_header_list_size: int, source: str) -> None:
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = max_header_list_size
        self._source = source  # for errors: "" or " from the backend"
        self._seen: dict[frozenset[bytes], dict[bytes, dict[bytes, bytes]]] = {}
        # peek_all's, the same way: a hooked call's block (every header) each time its method is called.
        self._seen_all: dict[bytes, list[tuple[bytes, bytes]]] = {}
        # Every header of the block the last peek read, when reading it
        # changed the table (it cannot be read again); else None.
        self.every: list[tuple[bytes, bytes]] | None = None

    def allow_table_size(self, size: int) -> None:
        """The peer's encoder may use ``size`` bytes of table (the other side's SETTINGS)."""
        if size != self._decoder.max_allowed_table_size:
            self._decoder.max_allowed_table_size = size
            self._forget()

    def peek(self, block: bytes, wanted: frozenset[bytes]) -> dict[bytes, bytes] | None:
        """As ``peek`` (with ``every`` set); the answer is shared, not to be changed."""
        self.every = None
        seen = self._seen.get(wanted)
        if seen is None:
            seen = self._seen[wanted] = {}
        found = seen.get(block)
        if found is None:
            read = _read(self._decoder, block, wanted)
            if read is None:
                return None
            headers, changed = read
            found = {name: value for name, value in headers if name in wanted}
            if changed:  # what was remembered may now read otherwise
                self._forget()
                self.every = headers
            else:
                _remember(seen, block, found)
        return found

    def peek_all(self, block: bytes) -> list[tuple[bytes, bytes]] | None:
        """As ``peek_all``, remembered as ``peek`` remembers; the list is the caller's."""
        seen = self._seen_all
        found = seen.get(block)
        if found is None:
            read = _read(self._decoder, block, None)
            if read is None:
                return None
            found, changed = read
            if changed:
                self._forget()
                return found
            _remember(seen, block, found)
        return found.copy()

    def _forget(self) -> None:
        """The table changed, or what it may hold: blocks may read otherwise now."""
        self._seen.clear()
        self._seen_all.clear()

    def table_state(self) -> tuple[tuple[tuple[bytes, bytes], ...], int]:
        """The dynamic table's entries and size limit, to tell whether a block changed them."""
        table = self._decoder.header_table
        return tuple(table.dynamic_entries), table.maxsize

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """Every header, with the table updated; a bad block is a connection error."""
        self._forget()
        try:
            # raw: a -bin value may be true binary (grpc's 0xfe03 setting)
            return self._decoder.decode(block, raw=True)  # type: ignore[return-value]  # raw=True: a list of bytes pairs
        except hpack.HPACKError as exc:
            raise FrameError(ErrorCode.COMPRESSION_ERROR, f"bad header block{self._source}: {exc}") from exc
