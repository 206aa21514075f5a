"""The proxy's sends to the client: one FIFO under the client's connection window.

The response direction's connection-level flow control is owned by the proxy
(per hop): the backend's DATA and the proxy's own answers (diverted calls)
share the client's window, so both go through this queue, in order. An item
is either a run of whole frames that costs no window (a header block is never
split), one stream's DATA, split when the window is smaller than it, or a
gate: a hooked call's first answer block, held until the hook stage has
recorded the call (see hooked.py). The gate holds what follows it too, since
header blocks must reach the client in the order the backend encoded them
(HPACK). The backend's connection window is given back as its DATA leaves:
so a closed gate whose call still needs the backend's DATA opens early once
the DATA held behind it nears what that window allows (``hold_limit``), or
the backend could send nothing more, that call's answer included, which its
stages wait for.

Nothing goes out before the runtime's first SETTINGS, the client's server
preface (RFC 9113, section 3.4): what the proxy says before them (a PING's
answer, a GOAWAY at shutdown, its own answers) waits, and follows them.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable

from . import frame as fr
from .frame import FrameType
from .window import Gate, QueuedData, WindowQueue, detached


class Outbound:
    def __init__(
        self, writer: asyncio.Transport, credit_backend: Callable[[int], None], hold_limit: int,
        drained: Callable[[], None] = lambda: None,
    ) -> None:
        self._writer = writer
        self._drained = drained  # told once what waited in the queue has been written (check_idle)
        self._emptied = False
        self._credit_backend = credit_backend
        self._queue = WindowQueue("client")
        self._pending: list[bytes | memoryview] = []  # views of what was read, mostly (downstream.py)
        self._credit = 0
        self._queued_credit = 0  # the backend's window owed for the DATA in the queue
        self._hold_limit = hold_limit  # how much of it a closed gate may hold back
        self._held = True  # until ``preface``
        # Gates not yet opened, perhaps (with their time limits), and the one timer for them all.
        self._gates: deque[tuple[float, Gate]] = deque()
        self._gates_timer: asyncio.TimerHandle | None = None
        self._gates_at = math.inf

    def preface(self, raw: bytes) -> None:
        """The server preface: it goes first, then what waited for it."""
        self._pending.insert(0, raw)
        self._held = False

    def release(self) -> None:
        """A connection error before the preface: what waited for it is dropped,
        and the GOAWAY queued next follows an empty SETTINGS, a valid preface."""
        if self._held:
            self._held = False
            self._pending[:] = [fr.serialize(FrameType.SETTINGS, 0, 0)]
            self._queue.items.clear()
            self._queued_credit = 0

    @property
    def prefaced(self) -> bool:
        """The server preface is out (or a connection error's GOAWAY let what waited go)."""
        return not self._held

    @property
    def held(self) -> int:
        """Bytes waiting for the preface (the client's side bounds them, upstream.py)."""
        return sum(len(raw) for raw in self._pending) if self._held else 0

    def frames(self, raw: bytes | memoryview) -> None:
        """Whole frames that cost no window (written in order at the next flush)."""
        if self._queue.items:
            self._queue.items.append(bytes(raw))  # the queue holds bytes only
        else:
            self._pending.append(raw)

    def control(self, raw: bytes | memoryview) -> None:
        """Frames with no order to keep against queued DATA (WINDOW_UPDATE, PING, SETTINGS, GOAWAY):
        they go out at the next flush even while DATA waits for the window."""
        self._pending.append(raw)

    def gate(self, raw: bytes, limit: float, stalls: Callable[[], bool]) -> Gate:
        """``raw`` (whole frames), and everything queued after it, wait for
        ``Gate.open``, or ``limit`` seconds at most (see ``Gate.stalls``).

        Every gate's limit is kept on one timer, set for the earliest gate
        still closed (a hooked call's own timer, made and cancelled, cost
        some 11,000 instructions): a gate that opens before its limit leaves
        the timer as it is, and is dropped once no gate before it is closed."""
        gate = Gate(raw, self._gate_opened, stalls)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        self._gates.append((deadline, gate))
        if deadline < self._gates_at:
            self._limit_gates_at(loop, deadline)
        self._queue.items.append(gate)
        return gate

    def _gate_opened(self) -> None:
        gates = self._gates
        while gates and gates[0][1].is_open:  # (they open in about the order they came; its call is freed)
            gates.popleft()
        self.pump()
        self.flush()

    def _limit_gates_at(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._gates_timer is not None:
            self._gates_timer.cancel()
        self._gates_at = when
        self._gates_timer = loop.call_at(when, self._limit_gates, loop)

    def close(self) -> None:
        """The connection is closed: the gates' timer goes now, not at the
        earliest limit (a second on), and with it the connection it holds on to."""
        if self._gates_timer is not None:
            self._gates_timer.cancel()
        self._gates_timer, self._gates_at = None, math.inf

    def _limit_gates(self, loop: asyncio.AbstractEventLoop) -> None:
        """The gates whose limit has come open, in the order they came; the timer is set for the next."""
        now = max(loop.time(), self._gates_at)  # (a timer run a little early: see Deadlines._fire)
        self._gates_timer, self._gates_at = None, math.inf
        for deadline, gate in list(self._gates):  # (an opening pumps, which may open another)
            if not gate.is_open and deadline <= now:
                gate.open()
        # Rebuilt from the list as it is now: a gate added while opening others keeps its limit.
        closed = self._gates = deque(entry for entry in self._gates if not entry[1].is_open)
        if closed:
            self._limit_gates_at(loop, min(deadline for deadline, _ in closed))

    def take(self, size: int) -> bool:
        """A relayed DATA frame of ``size`` may go now, in the caller's run of
        verbatim frames (passed to ``frames`` once it ends): its window is spent."""
        queue = self._queue
        if queue.items or size > queue.window:
            return False
        queue.window -= size
        self._credit += size
        return True

    @property
    def flowing(self) -> bool:
        """Nothing waits for the window: a run of whole frames goes as it is."""
        return not self._queue.items

    def data(self, stream_id: int, payload: bytes | memoryview, end_stream: bool, credit: int = 0,
             raw: bytes | memoryview | None = None) -> None:
        """One DATA frame's payload; ``raw`` is the frame as received, sent as is when it fits."""
        queue = self._queue
        if raw is not None and not queue.items and len(payload) <= queue.window:
            queue.window -= len(payload)
            self._pending.append(raw)
            self._credit += credit
            return
        queue.items.append(QueuedData(stream_id, bytes(payload), end_stream, credit))
        self._queued_credit += credit
        self.pump()

    def flush(self) -> None:
        pending = self._pending
        if pending and not self._held:
            # uvloop closes a transport on a socket error and tells the protocol a
            # turn later; a write meanwhile would raise (asyncio's drops it).
            if not self._writer.is_closing():
                if len(pending) == 1:
                    self._writer.write(detached(pending[0]))
                else:
                    # uvloop sends the pieces in one writev, uncopied (a read with a
                    # carried frame is two: joined, the whole read was copied once
                    # more). asyncio's transport joins them itself on Python 3.11; from
                    # 3.12 it keeps a memoryview of each piece for sendmsg, as uvloop
                    # keeps what it could not send yet. Either way no piece may change
                    # after this, and none does: each is a view of a read's ``bytes``
                    # (data_received), fresh bytes (Carry.complete) or a frame the
                    # proxy serialized.
                    self._writer.writelines([detached(raw) for raw in pending])
            pending.clear()
        if self._emptied:
            self._emptied = False
            self._drained()
        if self._credit:
            credit, self._credit = self._credit, 0
            self._credit_backend(credit)

    def grow(self, increment: int) -> None:
        self._queue.grow(increment)
        if self._queue.items:  # (a client's update per answer read finds none waiting: nothing to pump)
            self.pump()

    def pump(self) -> None:
        waited = bool(self._queue.items)
        freed = self._queue.drain(self._pending)
        if waited and not self._queue.items:
            self._emptied = True  # said at the next flush, once written
        self._credit += freed
        self._queued_credit -= freed
        if self._queued_credit >= self._hold_limit:
            items = self._queue.items
            head = items[0] if items else None
            if isinstance(head, Gate) and not head.is_open and head.stalls():
                head.open()  # as at its time limit (its opening pumps again)

    @property
    def window(self) -> int:
        """The client's connection receive window, as the proxy counts it."""
        return self._queue.window

    @property
    def queued(self) -> int:
        return len(self._queue.items)
