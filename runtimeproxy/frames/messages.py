"""gRPC's length-prefixed messages in a call's body, for the calls the proxy reads.

A compressed message is inflated here (gzip and deflate, what grpc offers),
bounded by the message size limit as it is inflated: a few kB of gzip must
not become gigabytes in the proxy.
"""

from __future__ import annotations

import struct
import zlib

import grpc

_PREFIX = struct.Struct(">BI")
# zlib's wbits for each grpc-encoding (gzip's header and trailer, or zlib's).
_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}


class BadMessages(str):
    """Why a body is no valid sequence of messages (its text), and the status
    grpc answers that with (``code``)."""

    code: grpc.StatusCode

    def __new__(cls, text: str, code: grpc.StatusCode = grpc.StatusCode.INTERNAL) -> BadMessages:
        bad = super().__new__(cls, text)
        bad.code = code
        return bad


def split_messages(body: bytes, encoding: bytes | None = None, limit: int | None = None) -> list[bytes] | BadMessages:
    """The messages of ``body``, inflated per the call's ``encoding`` (its
    grpc-encoding header; None: a compressed one is refused), each at most
    ``limit`` bytes once inflated."""
    out, i = [], 0
    while i < len(body):
        if len(body) - i < 5:
            return BadMessages("truncated gRPC message")
        compressed, length = _PREFIX.unpack_from(body, i)
        message = body[i + 5 : i + 5 + length]
        if len(message) != length:
            return BadMessages("truncated gRPC message")
        if compressed:
            inflated = inflate(message, encoding, limit)
            if isinstance(inflated, BadMessages):
                return inflated
            message = inflated
        out.append(message)
        i += 5 + length
    return out


def inflate(message: bytes, encoding: bytes | None, limit: int | None, what: str = "request message") -> bytes | BadMessages:
    """One compressed message, inflated per ``encoding`` (None: refused as
    not read here), at most ``limit`` bytes; ``what`` it is, for the text.

    Also the SDK's hook server's (hooks/frameserver/calls.py, one_message)
    and the hook client's (hookclient/stream.py): one reading of gzip and
    deflate for all three, as grpc reads them."""
    if encoding is None:
        return BadMessages("compressed message, not read here", grpc.StatusCode.UNIMPLEMENTED)
    if encoding == b"identity":
        return BadMessages("compressed message without grpc-encoding")
    wbits = _WBITS.get(encoding)
    if wbits is None:
        return BadMessages(f"grpc-encoding {encoding.decode('latin-1')[:32]!r} is not supported (gzip, deflate)",
                           grpc.StatusCode.UNIMPLEMENTED)
    if not message:  # nothing to inflate: an empty message, as grpc reads it
        return b""
    inflater = zlib.decompressobj(wbits)
    try:
        # One byte over the limit tells "too large" from "exactly the limit".
        out = inflater.decompress(message, limit + 1 if limit is not None else 0)
    except zlib.error as exc:
        return BadMessages(f"cannot inflate a {encoding.decode()} message: {exc}")
    if limit is not None and (len(out) > limit or inflater.unconsumed_tail):
        return BadMessages(f"{what} over the limit of {limit} bytes once inflated",
                           grpc.StatusCode.RESOURCE_EXHAUSTED)
    if not inflater.eof:
        return BadMessages(f"truncated {encoding.decode()} message")
    if inflater.unused_data:  # bytes after the end (junk, or a second gzip member): grpc refuses them
        return BadMessages(f"{encoding.decode()} message with {len(inflater.unused_data)} bytes after its end")
    return out
