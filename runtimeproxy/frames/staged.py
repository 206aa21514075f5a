"""A hooked call's task (hooked.py): from its complete request, through the
router's stages, to its released answer.

The stages see a FramesContext for grpc's ServicerContext; what they send
on goes to the runtime re-framed under its windows (``_send``), or was sent
as it was read (``as_read_frames``); the runtime's one answer message is
what they get back (``_answer``). ``finish`` frees the call's slot and
opens its gate however the task ends.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from ..cripath.forward import call_issued
from ..cripath.stage import compose
from . import frame as fr
from .divert import call_metadata, parse_timeout
from .frame import ErrorCode
from .messages import split_messages

if TYPE_CHECKING:
    from .connection import FrameConnection
    from .hooked import Hooked

# Its lines were hooked.py's before the split: the logger's name is kept for operators' filters.
log = logging.getLogger(__package__ + ".hooked")


class Aborted(Exception):
    """A stage ended the call (``context.abort``)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class BackendFailed(Exception):
    """The runtime's answer was not OK; it reaches the client as it came."""


class FramesContext:
    """What stages use of grpc's ServicerContext, for a call on the frames path."""

    def __init__(self, headers: list[tuple[bytes, bytes]], request_sent: bool = False,
                 answer_at_once: Callable[[Callable[[], bool]], None] | None = None) -> None:
        self._headers = headers
        self.request_sent = request_sent  # see cripath.stage.request_sent
        self.answer_at_once = answer_at_once  # see cripath.stage.answer_at_once
        self._started = asyncio.get_running_loop().time()  # the deadline is read from here, when asked

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        raise Aborted(code, details)

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return call_metadata(self._headers)

    def time_remaining(self) -> float | None:
        timeout = dict(self._headers).get(b"grpc-timeout")
        seconds = parse_timeout(timeout.decode("latin-1")) if timeout else None
        if seconds is None:
            return None
        return max(0.0, self._started + seconds - asyncio.get_running_loop().time())

    def cancelled(self) -> bool:
        return False


async def run(conn: FrameConnection, call: Hooked) -> None:
    """The call, from its complete request to its released answer."""
    try:
        if not await _request_complete(call):
            return  # the runtime ended the stream first; the client has its answer
        messages = split_messages(bytes(call.body))
        if isinstance(messages, str) or len(messages) != 1:
            text = messages if isinstance(messages, str) else f"{len(messages)} request messages for a unary call"
            conn.end_hooked(call.stream_id, grpc.StatusCode.INTERNAL, f"runtime-proxy: {text}")
            return

        message = messages[0]

        async def send(request: bytes, context: Any) -> bytes:
            if call.sent_as_read:
                if request != message:
                    raise RuntimeError("a stage changed a request the runtime already has")
                call.sent_as_read = False
                return await _answer(call)
            return await _send(conn, call, request)

        context = FramesContext(call.headers, request_sent=call.sent_as_read, answer_at_once=call.release_at_answer)
        await compose(call.stages, send)(message, context)
    except Aborted as refusal:
        if not call.sent:
            conn.end_hooked(call.stream_id, refusal.code, refusal.details)
        else:  # the runtime has the request: its answer stands
            log.warning("a stage refused after the call was sent; the runtime's answer is relayed",
                        extra={"method": call.path, "code": refusal.code.name, "error": refusal.details,
                               "stream": call.stream_id, **conn.identity})
    except BackendFailed:
        pass  # the runtime's status reaches the client verbatim
    except Exception:
        log.exception("frames: hooked call failed",
                      extra={"method": call.path, "stream": call.stream_id, **conn.identity})
        if call.gate is not None and call.gate.is_open:
            pass  # the runtime's answer went (as it came, or at the gate's limit): it stands
        elif call.gate is not None:
            # The runtime's answer is held and must still go (HPACK), so the
            # client learns first, from a reset, that the call failed.
            conn.out.control(fr.rst_stream(call.stream_id, ErrorCode.INTERNAL_ERROR))
            conn.out.flush()
        else:  # the client gets an answer; the runtime's, if it comes, is dropped
            conn.end_hooked(call.stream_id, grpc.StatusCode.INTERNAL, "runtime-proxy: internal error")
    finally:
        # At once, not a loop turn later when the task's done callback runs
        # finish again (which it does for a task cancelled before its first step).
        finish(conn, call)


def finish(conn: FrameConnection, call: Hooked) -> None:
    """The call is over for the proxy: its answer goes, its slot is freed. Run
    at the end of ``run``, and again (a no-op then) as its task's done
    callback (taken.start_hooked), which covers a task cancelled before its first step."""
    if call.finished:
        return
    call.finished = True
    if call.gate is not None:
        call.gate.open()
        # Its gate names the call (``stalls``): dropped, the pair is freed as the
        # call ends, not left as a cycle (with the call's task and futures)
        # for the collector to find.
        call.gate = None
    conn.hooked_done(call)


def as_read_frames(conn: FrameConnection, call: Hooked) -> list[bytes]:
    """The DATA frames of a complete request no stage may change
    (``Hooked.as_read``), its windows spent: if it is one uncompressed
    message and the backend's windows take it whole; else none, and the
    call's task sends it, as any hooked call's."""
    body = call.body
    size = len(body)
    if call.answered.done():  # the stream is over at the runtime
        return []
    if size < 5 or body[0] != 0 or int.from_bytes(body[1:5], "big") != size - 5:
        return []
    if size > call.window or not conn.inbound.take(size):
        return []
    call.window -= size
    call.sent = call.sent_as_read = True
    return fr.data_frames(call.stream_id, bytes(body), conn.backend_frames.send, True)


async def _request_complete(call: Hooked) -> bool:
    """Until the client's request is complete (True) or the runtime ended the stream (False).

    Awaited directly (``answer`` ends the request too): the task then wakes in
    the loop turn after the read that completed its request, ahead of the
    calls read after it, so it takes its object's lock before they do."""
    while not call.request_ended:
        await _until(call)
    return not call.cut_short


async def _until(call: Hooked) -> None:
    """Until something its task waits for may have come (``Hooked._wake``): the caller looks again."""
    call.waiter = asyncio.get_running_loop().create_future()
    try:
        await call.waiter
    finally:
        call.waiter = None


async def _send(conn: FrameConnection, call: Hooked, request: bytes) -> bytes:
    """The stages' request to the backend; the backend's one answer message."""
    if call.sent:
        raise RuntimeError("a hooked call is sent once")
    call.sent = True
    view = memoryview(struct.pack(">BI", 0, len(request)) + request)
    while view:
        while call.window <= 0 and not call.answered.done():
            await _until(call)
        if call.answered.done():  # reset or ended before the request was all sent
            break
        n = min(call.window, conn.backend_frames.send, len(view))
        call.window -= n
        conn.inbound.data(call.stream_id, bytes(view[:n]), n == len(view))
        view = view[n:]
    return await _answer(call)


async def _answer(call: Hooked) -> bytes:
    """The backend's one answer message, once its request is sent."""
    notify = call_issued.get()
    if notify is not None:
        notify()  # later calls on this connection reach the runtime after it
    status, message = await call.answered
    if status != 0:
        raise BackendFailed(message)
    reply = split_messages(bytes(call.reply))
    if isinstance(reply, str):  # compressed: the stage cannot read it, the client can
        return bytes(call.reply[5:])
    if len(reply) != 1:
        raise BackendFailed(f"{len(reply)} answer messages for a unary call")
    return reply[0]
