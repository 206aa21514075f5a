"""What a frames connection knows of one gRPC call: its route, limits, state and message."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

Route = Callable[[bytes], Awaitable[bytes]]  # a method's handler: request message -> response message
PREFIX = struct.Struct(">BI")  # a gRPC message's compressed flag and length


class CallError(Exception):
    """Raised by a route: the call ends with this gRPC status."""

    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        super().__init__(details or code.name)
        self.code = code
        self.details = details


@dataclass(frozen=True)
class Limits:
    max_receive: int  # largest request message, bytes
    max_send: int  # largest response message, bytes


@dataclass(eq=False)
class Call:
    sid: int
    route: Route | None
    timeout: float | None
    window: int  # the peer's window for what this side sends on the stream
    body: bytearray = field(default_factory=bytearray)
    receiving: bool = True  # the request has not ended yet
    out: memoryview | None = None  # the framed response message, as far as it is not sent
    task: asyncio.Task[None] | None = None


def one_message(body: bytearray) -> bytes | CallError:
    """A unary request's one uncompressed message, or why there is none."""
    if len(body) < PREFIX.size:
        return CallError(grpc.StatusCode.INTERNAL, "no request message")
    compressed, length = PREFIX.unpack_from(body)
    if compressed:
        return CallError(grpc.StatusCode.UNIMPLEMENTED, "compressed messages are not served; send identity")
    if length != len(body) - PREFIX.size:
        return CallError(grpc.StatusCode.INTERNAL, "request is not one whole gRPC message")
    return bytes(memoryview(body)[PREFIX.size:])
