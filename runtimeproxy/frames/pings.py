"""The runtime's pings, answered by the proxy a little later (per hop, see downstream.py).

grpc-go pings each time it reads DATA while no ping of its is unanswered: the
BDP estimate that sizes its receive window. Answered at once, that is one
more wake-up of the proxy and of the runtime for every call: the ping arrives
in a write of its own, between the request and the answer. Answered within
``ACK_DELAY_S`` instead, it costs them once per delay, whatever the call
rate. RFC 9113 (6.7) asks for an answer, "SHOULD be given higher priority",
not an immediate one; the runtime's keepalive waits 20 s by default (grpc-go
``keepalive.ServerParameters.Timeout``). The estimate sees a longer round
trip over which more DATA arrived, so its window grows no slower.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from . import frame as fr
from .frame import Flag, FrameType

ACK_DELAY_S = 0.2  # the longest a runtime's ping waits for its answer
MAX_HELD = 16  # pings held at once; more are answered at once (grpc-go never has two out)


class DelayedAcks:
    def __init__(self, write: Callable[[bytes], None], delay: float = ACK_DELAY_S) -> None:
        self._write = write  # to the runtime, as the connection has it when the answer leaves
        self._delay = delay
        self._held: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None

    def ping(self, payload: bytes) -> None:
        """A ping (not an ACK) came with ``payload``: its answer leaves within the delay."""
        self._held.append(fr.serialize(FrameType.PING, Flag.ACK, 0, payload))
        if len(self._held) >= MAX_HELD or not self._delay:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay, self.flush)

    def flush(self) -> None:
        """Every held answer goes now, in the order the pings came."""
        self._cancel_timer()
        if self._held:
            held, self._held = self._held, []
            self._write(b"".join(held))

    def at_once(self) -> None:
        """From now on every ping is answered at once: the runtime goes away, and
        grpc-go's graceful stop waits for the answer to its ping before it names
        the last stream it will serve."""
        self._delay = 0.0
        self.flush()

    def close(self) -> None:
        """The connection is over: nothing more goes out."""
        self._cancel_timer()
        self._held.clear()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def held(self) -> int:
        return len(self._held)
