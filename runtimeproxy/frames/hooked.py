"""Hooked calls on a frames connection: the router's stages, in place.

A unary call whose method has stages (hooks) in a version the backend serves
natively stays on the client's own backend connection (connection.py):

- its header block goes to the backend at once, unaltered (HPACK stays in
  step) but without END_STREAM;
- its request DATA is taken by the proxy to the end of the message, decoded
  and run through the stages the grpc path runs (hook stage: pre hooks,
  merge, ordering, store, post hooks; the same code, not a copy);
- what the stages send on is re-framed at the backend's max frame size under
  the backend's stream and connection windows;
- unless no stage may change it (``Routes.sends_unchanged``: no pre hook, no
  earlier call to keep it behind): then the request goes on as it was read,
  once complete (``staged.as_read_frames``), and the stages run beside the
  runtime's work, told so by ``FramesContext.request_sent``; a client or
  connection that leaves before they asked for the answer ends it as
  CANCELLED for them (``Hooked.cancel``), so they re-check what the runtime did;
- the answer is teed for the stages and relayed to the client verbatim, held
  from its first header block (outbound.Gate) until the stages are done, so
  the client never sees an answer the proxy has not recorded yet, as on the
  grpc path, and gets it in one write; unless the stages said a success may
  go as it comes (``FramesContext.answer_at_once``: recording it reads
  nothing from the runtime), then it goes in the read that completes it,
  and they finish in the loop turns that follow, ahead of any call read
  after it.

A stage that refuses before anything was sent (a Fail hook) gets the stream
reset at the backend and its status answered to the client by the proxy. A
call the runtime ends (resets, answers, or closes its connection: runtimegone.py)
before its request was sent has its stages stopped, as when its client leaves.

This module is the call's state, as the relay feeds it; its task, which
runs the stages and sends the request, is staged.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from ..cripath.stage import Stage
from .window import Gate

RESET = -1  # a call's "status" when the runtime reset its stream: it gave no answer


@dataclass
class Hooked:
    """One hooked call: fed by the relay in both directions, driven by its task (staged.run)."""

    stream_id: int
    path: str
    headers: list[tuple[bytes, bytes]]
    stages: tuple[Stage, ...]
    window: int  # the backend's receive window for this stream
    body: bytearray = field(default_factory=bytearray)
    request_ended: bool = False  # the client's request is complete, or cut short (``end_request``)
    # What its task awaits while it waits for its request's end or the
    # backend's window (``staged._until``): made only then, where two asyncio.Events
    # per call cost every call their making, setting and waiting.
    waiter: asyncio.Future[None] | None = None
    reply: bytearray = field(default_factory=bytearray)  # the backend's DATA, teed
    held: int = 0  # of its DATA, what waits behind the closed gate (flow-controlled bytes)
    answered: asyncio.Future[tuple[int, str]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )  # grpc-status and -message once the backend ended the stream
    gate: Gate | None = None
    as_read: bool = False  # its request may go as it was read (staged.as_read_frames)
    sent: bool = False
    sent_as_read: bool = False  # it went so, before the stages ran
    cut_short: bool = False  # the runtime ended the stream before the request was complete
    at_once: Callable[[], bool] | None = None  # whether a success may go as it arrives (``release_at_answer``)
    went_at_once: bool = False  # it did: the client has it, the stages finish what they record
    finished: bool = False
    stream_over: bool = False  # its stream ended (FrameConnection.stream_done), its end queued behind its gate
    task: asyncio.Task[None] | None = None

    @property
    def over_at_client(self) -> bool:
        """Its stream's end is queued for the client and its own gate (if
        any) is open, while the stages may still be finishing (recording a
        success that went as it came, or after their gate's time limit). The
        end may still wait in the outbound queue, which is FIFO: for the
        client's window, or behind another call's closed gate. So this may
        say over a little early, never late: the lax side, as a relayed call
        is counted out at stream_done though its end may still be queued."""
        return self.stream_over and (self.gate is None or self.gate.is_open)

    def wants_data(self) -> bool:
        """Whether its answer still needs DATA from the runtime: not ended, and
        its one message not whole yet (the trailers cost no window). Only then
        can holding it keep the runtime from sending what its stages wait for."""
        reply = self.reply
        return not self.answered.done() and (len(reply) < 5 or len(reply) < 5 + int.from_bytes(reply[1:5], "big"))

    @property
    def answered_whole(self) -> bool:
        """Answered, not reset by the runtime: an answer the client is owed,
        unless the proxy ended the stream itself (FrameConnection.ended)."""
        return self.answered.done() and self.answered.result()[0] != RESET

    def release_if_stalled(self, window: int) -> None:
        """Its held answer goes now, as at its gate's time limit, once the
        runtime may send no more of it until the client reads some (the
        stream's window is end to end: ``window`` is the client's initial one)
        while the stages still wait for more of it."""
        if self.gate is not None and not self.gate.is_open and self.held >= window and self.wants_data():
            self.gate.open()

    def answer(self, status: int, message: str) -> None:
        if not self.answered.done():
            self.answered.set_result((status, message))
            if not self.request_ended:  # before the request was complete: it never will be
                self.cut_short = True
                self.request_ended = True
            self._wake()  # a request still waiting for window: the stream is over
            self._release_at_once()

    def runtime_ended(self, status: int, message: str) -> None:
        """The runtime ended the stream (its status, or RESET). If its request
        was complete and not sent yet, the stages are stopped, as when the
        client leaves: the call they would ask hooks about is over at the
        runtime, and the client gets the runtime's answer now, not after them."""
        unsent = not self.sent and self.request_ended and not self.answered.done()
        self.answer(status, message)
        if unsent and self.task is not None:
            self.task.cancel()

    def end_request(self) -> None:
        """The client's request is complete (its END_STREAM came)."""
        self.request_ended = True
        self._wake()

    def window_grew(self) -> None:
        """The backend's window for its stream grew: a request waiting for it may go on."""
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def release_at_answer(self, ready: Callable[[], bool]) -> None:
        """The stages need not hold a successful answer if ``ready()`` says so
        when it comes (``cripath.stage.answer_at_once``): it goes in the read
        that completes it, not a loop turn or more later, once they are done.
        Their work after it runs in the next turns, queued before any call read
        after it, so a client's next call finds the state this one recorded."""
        self.at_once = ready
        if self.answered.done():
            self._release_at_once()

    def _release_at_once(self) -> None:
        if self.at_once is None or self.gate is None or self.gate.is_open or self.answered.result()[0] != 0:
            return
        if self.at_once():
            self.went_at_once = True
            self.gate.open()

    def cancel(self, message: str) -> None:
        """The call is over for the proxy (the client or a connection left).
        Its task is cancelled, unless the runtime has its request and the
        stages have not asked for the answer yet: they then get it as failed
        (``message``, unless it was answered already), and re-check what the
        runtime did (hook stage); or unless its success went as it came: the
        stages then finish recording it."""
        if self.went_at_once:
            return  # the client has its success: the stages record it, as they would had it stayed
        if self.sent_as_read:
            self.answer(1, message)
        elif self.task is not None:
            self.task.cancel()


_STATUS_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def status_name(status: int) -> str:
    return _STATUS_NAMES.get(status, "UNKNOWN")


def compressed(headers: list[tuple[bytes, bytes]]) -> bool:
    """A request's headers name a grpc-encoding other than identity. Of two,
    the last counts: as grpc reads them, and as divert.py's decode does, so a
    call judged plain here is never one that path would inflate."""
    encoding = b"identity"
    for name, value in headers:  # (a loop, not a generator: once per hooked call)
        if name == b"grpc-encoding":
            encoding = value
    return encoding != b"identity"


def grpc_status(values: dict[bytes, bytes]) -> tuple[int, str]:
    """A final header block's status (UNKNOWN if it has none)."""
    raw = values.get(b"grpc-status", b"2")
    return (int(raw) if raw.isdigit() else 2), values.get(b"grpc-message", b"").decode("latin-1")
