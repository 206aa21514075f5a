"""One client connection relayed frame by frame to one backend connection.

Frames of calls that need nothing from the proxy pass verbatim both ways, so
the two hops behave as one end-to-end HTTP/2 connection: SETTINGS, GOAWAY,
RST_STREAM and the request direction's WINDOW_UPDATEs keep their meaning
between client and backend. PING is per hop: the proxy answers each side's
(upstream.py, downstream.py; the runtime's within a delay, pings.py).
Header blocks are never altered, so the HPACK state stays consistent; the
proxy decodes the client's blocks only to read ``:path``.

A unary call with hooks stays on this connection and runs the router's
stages in place (hooked.py). A call the proxy must answer itself (health,
refusals, translated versions, compressed hooked requests; see routes.py) is
*diverted*: its header block still goes to the backend (the backend's HPACK
decoder must see it) followed at once by RST_STREAM, and the call is
answered by the proxy's own grpc.aio server (divert.py). A backend that
answers such a stream before it reads the RST_STREAM has its header block
passed to the client on a stream the client never uses again
(downstream.BackendSide._stray).

What the connection does when its runtime closes or goes away is
runtimegone.py's; what each side's SETTINGS change, settings.py's; the
bound on a runtime that accepts the connection and sends no SETTINGS,
silent.py's.

Flow control per hop: the proxy owns both directions' connection windows
(outbound.py, inbound.py), since its own DATA (answers, re-framed hooked
requests) shares them with the relayed streams', and credits the client for
the DATA it consumed. Stream windows of relayed streams stay end to end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc
from grpc import aio

from ..cripath.stage import Stage
from . import frame as fr
from . import hooked, hpackstatic, idle, peerid, runtimegone
from .divert import Diverted, status_frames
from .downstream import BackendSide
from .frame import ErrorCode, FrameError
from .hooked import status_name
from .inbound import CREDIT_BATCH, Corked, Gone, Inbound
from .msgsize import StreamSizes
from .outbound import Outbound
from .pings import DelayedAcks
from .upstream import BACKEND_GRANT, ClientSide

log = logging.getLogger(__name__)

ENDED_KEPT = 4096  # streams the proxy ended, remembered per connection
# Unsent to a client that is not reading: past this, its reads wait until it
# reads (a slow reader's frames only wait). Without it a client that writes and
# never reads (PINGs, streams over its limit) has its answers buffered without end.
CLIENT_BACKLOG = 4 << 20


class Routes(Protocol):
    def fast(self, path: str) -> bool:
        """True if a call on ``path`` is relayed verbatim to the backend."""

    def unary(self, path: str) -> bool:
        """True for a known unary method (waited for on shutdown)."""

    def hooked(self, path: str) -> tuple[Stage, ...] | None:
        """The stages of a call run in place (hooked.py), or None."""

    def sends_unchanged(self, path: str) -> bool:
        """True if a call hooked in place may go to the runtime as it is read (hooked.py)."""

    def measure(self, path: str) -> Callable[[str, float], None] | None:
        """A call on ``path`` starts: the function that records its end, or None."""

    def runtime_unimplemented(self) -> None:
        """A call relayed or hooked got UNIMPLEMENTED from the runtime: a
        restarted one may lack the version it was routed in (cripath/backend.py, probe_soon)."""

    def runtime_failed_status(self, status: int, message: str) -> None:
        """A call relayed or hooked got UNKNOWN or UNAVAILABLE (``status``) from the
        runtime with ``message``: containerd's "server is not initialized yet"
        says it does not serve (cripath/unready.py)."""


@dataclass(frozen=True)
class Limits:
    """The proxy's own limits, applied per hop as on the grpc path."""

    max_message: int  # --max-recv-message-bytes
    max_send: int | None = None  # --max-send-message-bytes (None: as max_message)
    max_streams: int = 1000  # --max-concurrent-streams, per client connection


class FrameConnection:
    def __init__(
        self, client: asyncio.Transport, backend: asyncio.Transport, routes: Routes, local: aio.Channel, limits: Limits,
        identity: dict[str, int | None] | None = None,
    ) -> None:
        # Transports, fed by protocols (listener.py): no task switch per read.
        self._client_writer = client
        # Which client this is (peerid.py): in the fields of every line about
        # this connection or its calls, read once (the listener's), not per line or frame.
        self.identity = peerid.client_identity(client) if identity is None else identity
        self.backend: Corked | Gone = Corked(backend)
        self.backend_side = BackendSide(self)
        self.client_side = ClientSide(self)
        self.closed = asyncio.get_running_loop().create_future()
        self.settings_wait: asyncio.TimerHandle | None = None  # the bound on the runtime's silence (silent.py)
        self.client_can_write = asyncio.Event()
        self.client_can_write.set()
        self._client_reads_held: set[str] = set()  # why the client's reads wait ("runtime", "backlog")
        self.routes = routes
        self.local = local
        # Every message is received on one hop and sent on the other: it must
        # fit both limits, requests and answers alike (the grpc path's server
        # receives and its channel sends, and the other way round).
        self.max_message = self.max_response = min(limits.max_message, limits.max_send or limits.max_message)
        self.max_streams = limits.max_streams
        self.sizes_in = StreamSizes(self.max_message)
        self.sizes_out = StreamSizes(self.max_response)
        self.responded: set[int] = set()  # relayed streams whose response headers went out
        self.ended: set[int] = set()  # relayed streams the proxy ended itself
        self.out = Outbound(self._client_writer, self.credit_backend, hold_limit=BACKEND_GRANT // 2,
                            drained=self.check_idle)
        self.inbound = Inbound(self.backend, self.credit_client)
        self.backend_pings = DelayedAcks(lambda data: self.backend.write(data))
        self.last_stream = 0
        # The latest stream whose end (END_STREAM or RST_STREAM) is queued for
        # the client: it ignores header blocks on it (downstream.py, _stray).
        self.closed_at_client = 0
        self.relayed: set[int] = set()  # open relayed streams
        self.unary_open: set[int] = set()  # of those, known unary calls
        self.diverted: dict[int, Diverted] = {}
        self.hooked: dict[int, hooked.Hooked] = {}
        self.client_frames = fr.AckedSetting(fr.DEFAULT_MAX_FRAME)  # what the client accepts
        self.backend_frames = fr.AckedSetting(fr.DEFAULT_MAX_FRAME)  # what the backend accepts
        # The backend's INITIAL_WINDOW_SIZE: the stream window of the proxy's own DATA (hooked requests).
        self.backend_windows = fr.AckedSetting(fr.DEFAULT_WINDOW)
        # Each side's HEADER_TABLE_SIZE: how large a table the other's encoder may keep (``relay``:
        # a smaller one holds once acknowledged), so how large the proxy's reader of its blocks allows.
        self.client_tables = fr.AckedSetting(fr.DEFAULT_HEADER_TABLE)
        self.backend_tables = fr.AckedSetting(fr.DEFAULT_HEADER_TABLE)
        self._client_uncredited = 0
        self.client_table_shrunk = False  # see table_update
        self.stopping = False
        self.backend_lost = False
        self.backend_going = False  # the runtime sent GOAWAY: new streams are refused
        self.backend_going_told = False  # its GOAWAY logged at info (runtimegone.going_away)
        self.backend_heads_up: str | None = None  # a drain's heads-up GOAWAY's debug data, once one came
        self.timed: dict[int, tuple[Callable[[str, float], None], float]] = {}  # relayed and hooked calls
        # No call left that shutdown waits for, and what shutdown waits on
        # (``wait_idle``): changed only by idle.py.
        self.is_idle = True
        self.idle_event: asyncio.Event | None = None

    # -- running ---------------------------------------------------------

    def client_data(self, chunk: bytes) -> None:
        # (The guard inline, here and in backend_data: no frame more per read.)
        if self.closed.done():
            return
        try:
            self.client_side.feed(chunk)
        except FrameError as exc:
            self._failed(exc, "client")
        if not self.client_can_write.is_set() and self._client_writer.get_write_buffer_size() > CLIENT_BACKLOG:
            # A client that reads nothing while it writes (PINGs, streams over
            # its limit) would have the proxy buffer its answers without end.
            self.hold_client_reads("backlog", True)

    def backend_data(self, chunk: bytes) -> None:
        if self.closed.done():
            return
        try:
            self.backend_side.feed(chunk)
        except FrameError as exc:
            self._failed(exc, "backend")

    def client_writable(self, writable: bool) -> None:
        """The client's transport buffer is full (or drained again): hold the backend."""
        if writable:
            self.client_can_write.set()
            self.backend.resume_reading()
            self.hold_client_reads("backlog", False)
        else:
            self.client_can_write.clear()
            self.backend.pause_reading()

    def backend_writable(self, writable: bool) -> None:
        self.hold_client_reads("runtime", not writable)

    def hold_client_reads(self, reason: str, hold: bool) -> None:
        """The client's reads wait while any reason holds them (the runtime's
        transport full, or the client's own, see ``client_data``)."""
        held = self._client_reads_held
        before = bool(held)
        if hold:
            held.add(reason)
        else:
            held.discard(reason)
        if bool(held) != before:
            (self._client_writer.pause_reading if held else self._client_writer.resume_reading)()

    def backend_gone(self) -> None:
        """The runtime closed its connection (runtimegone.py)."""
        runtimegone.closed(self)

    def backend_goaway(self, last: int, code: int, debug: bytes | memoryview) -> None:
        """The runtime goes away: no stream after ``last`` is processed (runtimegone.py)."""
        runtimegone.going_away(self, last, code, debug)

    def lost(self) -> None:
        """Either side closed: so does the other; the proxy's own answers stop."""
        for call in self.diverted.values():
            if call.task is not None:
                call.task.cancel()
        for hooked_call in self.hooked.values():
            hooked_call.cancel("the connection was lost")
        self._close()

    def _failed(self, exc: FrameError, side: str) -> None:
        """A connection error found reading ``side``: GOAWAY to the client, and the connection ends."""
        code = exc.code if side == "client" else ErrorCode.INTERNAL_ERROR
        log.warning("frames: connection error, %s side: %s", side, exc,
                    extra={"side": side, "code": code.name, "error": str(exc), **self.identity})
        self.out.release()
        self.out.control(fr.goaway(self.last_stream, code, str(exc).encode()[:200]))
        self.out.flush()
        self.lost()

    def _close(self) -> None:
        self.backend_pings.close()
        self.out.close()
        for writer in (self._client_writer, self.backend):
            writer.close()
        for sid in list(self.timed):
            self.stream_done(sid, "UNAVAILABLE")
        self.client_can_write.set()  # a diverted call waiting to send finds the connection gone
        if not self.closed.done():
            self.closed.set_result(None)
        self.check_idle()

    def begin_stop(self) -> None:
        """Shutdown: no new stream is relayed; the client is told to go away."""
        self.stopping = True
        log.debug("frames: telling the client to go away (shutdown)",
                  extra={"last_stream": self.last_stream, **self.identity})
        # Before the runtime's SETTINGS this waits for them (outbound.py), and the drain for it.
        self.out.control(fr.goaway(self.last_stream, ErrorCode.NO_ERROR))
        # Streams end now, as on the grpc path (kubelet retries UNAVAILABLE);
        # unary calls get the grace period.
        for sid in sorted(self.relayed - self.unary_open):
            self.inbound.ordered(self.end_locally(sid, 14, "runtime-proxy is shutting down"))
        self.out.flush()
        self.check_idle()

    @property
    def prefaced(self) -> bool:
        """The runtime's first SETTINGS, the client's server preface, are queued;
        before them nothing goes out to the client (outbound.py)."""
        return self.out.prefaced

    def server_prefaced(self) -> None:
        """The runtime's first SETTINGS are queued for the client: a stop's GOAWAY is on its way."""
        if self.settings_wait is not None:
            self.settings_wait.cancel()
            self.settings_wait = None
        self.check_idle()

    def table_update(self) -> bytes:
        """What a header block of the proxy's own starts with: once the client
        lowered its HEADER_TABLE_SIZE, the first block it gets after that must
        say the table shrank (RFC 7541 4.2), and it may be the proxy's. To the
        size in force, never below what the runtime's encoder may use."""
        return hpackstatic.integer(self.client_tables.acked, 5, 0x20) if self.client_table_shrunk else b""

    def end_locally(self, sid: int, status: int, message: str, error: ErrorCode = ErrorCode.CANCEL) -> bytes:
        """End a relayed call with a status of the proxy's; the RST_STREAM for
        the backend is returned, CANCEL unless the runtime broke the protocol."""
        self.out.frames(status_frames(sid, status, message, self.client_frames.send,
                                      trailers_only=sid not in self.responded, table_update=self.table_update()))
        self.mark_ended(sid)
        self.stream_done(sid, status_name(status))
        call = self.hooked.get(sid)
        if call is not None:
            call.answer(status, message)
        return fr.rst_stream(sid, error)

    def mark_ended(self, sid: int) -> None:
        """``sid`` was ended by the proxy: late frames for it are dropped. The
        oldest are forgotten past ENDED_KEPT (a late frame for one of those is
        dropped as any frame of a closed stream is)."""
        self.ended.add(sid)
        self.closed_at_client = sid
        if len(self.ended) > ENDED_KEPT:
            self.ended = set(sorted(self.ended)[ENDED_KEPT // 2 :])

    def end_hooked(self, sid: int, code: grpc.StatusCode, message: str) -> None:
        """A hooked call refused before its request was sent: the client gets the status."""
        if sid in self.ended or self.closed.done():
            return
        log.info("call refused", extra={"code": code.name, "error": message, "stream": sid, **self.identity})
        self.inbound.ordered(self.end_locally(sid, code.value[0], message))
        self.out.flush()

    def diverted_done(self, sid: int) -> None:
        """The proxy's answer on diverted stream ``sid`` is queued for the client, its end included."""
        self.diverted.pop(sid, None)
        self.mark_ended(sid)  # late frames of the backend for it are dropped
        self.check_idle()

    def hooked_done(self, call: hooked.Hooked) -> None:
        self.hooked.pop(call.stream_id, None)
        self.check_idle()

    def credit_client(self, amount: int) -> None:
        """The client's DATA, consumed: its connection window (ours, see inbound.py) grows again."""
        self._client_uncredited += amount
        if self._client_uncredited >= CREDIT_BATCH:
            self.out.control(fr.window_update(0, self._client_uncredited))
            self._client_uncredited = 0

    def credit_backend(self, amount: int) -> None:
        """The backend's DATA, gone to the client: its connection window grows
        again, with the next request (inbound.Corked.credit)."""
        self.backend.credit(amount)

    # What shutdown waits for (idle.py): its functions bound as methods, no call more.
    busy = idle.busy
    check_idle = idle.check
    wait_idle = idle.wait

    def at_stream_limit(self) -> bool:
        """The client has --max-concurrent-streams streams open here. A hooked
        call whose end it has does not count while its stages finish: the
        client counts it closed (RFC 9113 5.1.2) and may open another."""
        count = len(self.relayed) + len(self.hooked) + len(self.diverted)
        if count < self.max_streams:
            return False
        return count - sum(1 for call in self.hooked.values() if call.over_at_client) >= self.max_streams

    def start_timing(self, sid: int, path: str) -> None:
        record = self.routes.measure(path)
        if record is not None:
            self.timed[sid] = (record, time.perf_counter())

    def stream_done(self, sid: int, code: str) -> None:
        """A relayed or hooked stream ended with ``code`` (a gRPC status name)."""
        self.closed_at_client = sid
        call = self.hooked.get(sid)
        if call is not None:
            call.stream_over = True
        timed = self.timed.pop(sid, None)
        if timed is not None:
            timed[0](code, time.perf_counter() - timed[1])
        if code == "UNIMPLEMENTED":
            self.routes.runtime_unimplemented()
        self.relayed.discard(sid)
        self.responded.discard(sid)
        if self.sizes_in:  # (a unary call's relay makes none: msgsize.StreamSizes)
            self.sizes_in.pop(sid, None)
        if self.sizes_out:
            self.sizes_out.pop(sid, None)
        if sid in self.unary_open:
            self.unary_open.discard(sid)
            self.check_idle()
