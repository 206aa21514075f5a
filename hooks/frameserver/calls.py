"""What a frames connection knows of one gRPC call: its route, limits, state and message."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from runtimeproxy.frames.messages import BadMessages, inflate

Route = Callable[[bytes], Awaitable[bytes]]  # a method's handler: request message -> response message
PREFIX = struct.Struct(">BI")  # a gRPC message's compressed flag and length
# What a compressed request may use (grpc-encoding): what messages.inflate reads.
ACCEPTED_ENCODINGS = b"identity,deflate,gzip"
# The grpc-timeout of the call a route answers (set in its task by connection.py).
CALL_DEADLINE: ContextVar[Deadline | None] = ContextVar("call_deadline", default=None)
T = TypeVar("T")


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
    encoding: bytes = b"identity"  # the request's grpc-encoding
    out: memoryview | None = None  # the framed response message, as far as it is not sent
    task: asyncio.Task[None] | None = None


class Deadline:
    """A call's grpc-timeout over its handler's task, as ``asyncio.timeout``
    keeps one: the task is cancelled when it passes, and that cancel is the
    deadline's unless another came too. Made in the task as it starts, as
    that was; without its context manager's two coroutines and its state
    enum's lookups, which cost a hook call more than the timer itself."""

    __slots__ = ("_task", "_cancelling", "_timer", "_expired")

    def __init__(self, seconds: float, task: asyncio.Task[None] | None = None) -> None:
        """``task``: the task it runs in, if known (asyncio.current_task is a Python call)."""
        task = task or asyncio.current_task()
        assert task is not None
        self._task: asyncio.Task[object] | None = task
        self._cancelling, self._expired = task.cancelling(), False
        loop = task.get_loop()
        self._timer: asyncio.Handle | None = (
            loop.call_soon(self._expire) if seconds <= 0 else loop.call_at(loop.time() + seconds, self._expire))

    def _expire(self) -> None:
        self._expired, self._timer = True, None
        if self._task is not None:
            self._task.cancel()

    def expired(self) -> bool:
        return self._expired

    def end(self) -> bool:
        """The handler is done (answered, failed or cancelled): whether the
        deadline cancelled it, and nothing else did (as asyncio.timeout's exit)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # The task's context holds this deadline (CALL_DEADLINE): dropping the
        # task breaks that cycle, so the call's task, coroutines and context are
        # freed as it ends rather than left to the cyclic collector.
        task, self._task = self._task, None
        return self._expired and task is not None and task.uncancel() <= self._cancelling


async def within(deadline: Deadline | None, handler: Awaitable[T]) -> T:
    """``handler`` awaited under ``deadline`` (made in this task), as under
    ``asyncio.timeout``: TimeoutError if the deadline's cancel ended it and no
    other came too; another cancel goes on as CancelledError."""
    if deadline is None:
        return await handler
    try:
        try:
            return await handler
        finally:
            timed_out = deadline.end()  # once, whatever ended it: it takes back its own cancel request
    except asyncio.CancelledError:
        if timed_out:
            raise TimeoutError from None
        raise


def deadline_passed() -> bool:
    """In a route: whether its call's grpc-timeout has passed (a cancel then
    is the deadline's, not the caller's hang-up or the server's stop)."""
    deadline = CALL_DEADLINE.get()
    return deadline is not None and deadline.expired()


def one_message(body: bytearray, encoding: bytes, max_size: int) -> bytes | CallError:
    """A unary request's one message, decompressed, or why there is none."""
    if len(body) < PREFIX.size:
        return CallError(grpc.StatusCode.INTERNAL, "no request message")
    compressed, length = PREFIX.unpack_from(body)
    if length != len(body) - PREFIX.size:
        return CallError(grpc.StatusCode.INTERNAL, "request is not one whole gRPC message")
    message = bytes(memoryview(body)[PREFIX.size:])
    if not compressed or not message:  # an empty message needs no inflating (as grpc reads it)
        return message
    # Inflated as the proxy inflates a request or a hook answer: one reading
    # of gzip and deflate, bounded as it inflates (a small bomb cannot fill
    # memory), refusing a cut stream or bytes after its end, as grpc does.
    plain = inflate(message, encoding, max_size)
    if isinstance(plain, BadMessages):  # over the limit is no failure to decompress: said as it is
        exhausted = plain.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        return CallError(plain.code, str(plain) if exhausted else f"cannot decompress the request: {plain}")
    return plain
