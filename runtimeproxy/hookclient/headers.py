"""The header blocks of a hook call: the request's, and the answer's status.

The request's block uses only HPACK's static table and literals that are
never added to the dynamic one, so it carries no state between calls: it is
built once per method, and only ``grpc-timeout`` changes from call to call.
"""

from __future__ import annotations

from urllib.parse import unquote

import grpc

from ..frames.hpackstatic import field, stateless_block

USER_AGENT = b"runtime-proxy"
AUTHORITY = b"localhost"  # what grpc sends for a unix socket


def request_block_prefix(path: str) -> bytes:
    """Everything of a call's block but its timeout (``with_timeout``)."""
    return stateless_block((
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path.encode()),
        (b":authority", AUTHORITY),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"user-agent", USER_AGENT),
    ))


def with_timeout(prefix: bytes, seconds: float) -> bytes:
    """The whole block, with ``grpc-timeout`` (gRPC over HTTP/2: at most 8 digits and a unit)."""
    millis = max(1, int(seconds * 1000))
    if millis < 100_000_000:
        encoded = _TIMEOUTS.get(millis)
        if encoded is None:  # (a server's calls nearly all have the same few: its timeout, a millisecond less)
            if len(_TIMEOUTS) >= TIMEOUTS_KEPT:
                _TIMEOUTS.clear()
            encoded = _TIMEOUTS[millis] = field(b"grpc-timeout", b"%dm" % millis)
        return prefix + encoded
    return prefix + field(b"grpc-timeout", b"%dS" % min(99_999_999, int(seconds)))


TIMEOUTS_KEPT = 256  # grpc-timeout fields remembered, by milliseconds
_TIMEOUTS: dict[int, bytes] = {}


# gRPC's mapping of an HTTP status other than 200 (doc/http-grpc-status-mapping.md).
_HTTP_TO_GRPC = {
    400: grpc.StatusCode.INTERNAL,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.UNIMPLEMENTED,
    429: grpc.StatusCode.UNAVAILABLE,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.UNAVAILABLE,
}
_CODES = {code.value[0]: code for code in grpc.StatusCode}

# (grpc-encoding: read only of a compressed answer, stream.py)
WANTED = frozenset({b":status", b"content-type", b"grpc-status", b"grpc-message", b"grpc-encoding"})


def http_failure(headers: dict[bytes, bytes], ends: bool = False) -> tuple[grpc.StatusCode, str] | None:
    """Why a response's first header block is not a gRPC answer, or None.
    ``ends``: it ends the call (trailers-only): then a grpc-status in it is
    the answer, with or without a content-type, as grpc reads it."""
    status = headers.get(b":status", b"")
    if status != b"200":
        text = status.decode("latin-1") or "none"
        valid = len(status) == 3 and status.isdigit()
        code = _HTTP_TO_GRPC.get(int(status), grpc.StatusCode.UNKNOWN) if valid else grpc.StatusCode.INTERNAL
        return code, f"hook server answered HTTP status {text[:16]}, not 200"
    content_type = headers.get(b"content-type", b"")
    if ends and b"grpc-status" in headers:
        return None
    if not content_type.startswith(b"application/grpc"):
        return grpc.StatusCode.UNKNOWN, f"hook server answered content-type {content_type.decode('latin-1')[:64]!r}, not gRPC"
    return None


def grpc_status(headers: dict[bytes, bytes]) -> tuple[grpc.StatusCode, str]:
    """A final header block's status; UNKNOWN if it has none (as grpc reports it)."""
    raw = headers.get(b"grpc-status")
    if raw is None:
        return grpc.StatusCode.UNKNOWN, "hook server ended the call without a grpc-status"
    code = _CODES.get(int(raw)) if raw.isdigit() and len(raw) <= 3 else None
    raw_message = headers.get(b"grpc-message", b"")
    # (unquote returns a string without a % as it is: an OK answer has no message.
    # Tested for emptiness first: `bytes in bytes` first tries its operand as an
    # int, and formats the TypeError it then drops, at each hook call.)
    message = (unquote(raw_message.decode("latin-1"), errors="replace") if raw_message and b"%" in raw_message
               else raw_message.decode("latin-1"))
    if code is None:
        return grpc.StatusCode.UNKNOWN, f"hook server sent grpc-status {raw.decode('latin-1')[:16]!r}; {message}"
    return code, message
