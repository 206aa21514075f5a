"""The calls a frames connection does not relay verbatim (upstream.py), which
the proxy takes itself: their start, hooked in place (hooked.py) or diverted
to the proxy's own server (divert.py), and the client's DATA on them and on
streams that are over. None of that DATA reaches the backend: the proxy
gives the client its window back.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from . import divert
from . import frame as fr
from . import hooked, staged
from .frame import ErrorCode, Flag, FrameError

if TYPE_CHECKING:
    from ..cripath.stage import Stage
    from .connection import FrameConnection
    from .upstream import ClientSide


def start_hooked(side: ClientSide, sid: int, path: str, headers: list, stages: tuple[Stage, ...], raws: list[bytes],
         end_stream: bool, out: list[bytes | memoryview]) -> None:
    """A call hooked in place starts: its header block (``raws``) goes to the backend."""
    conn = side.conn
    # Not while an earlier hooked call of this connection is in its stage:
    # it may be on the same object, and take its lock only later.
    as_read = not end_stream and not conn.hooked and conn.routes.sends_unchanged(path)
    # The request follows, from the stages (or as it is read: staged.as_read_frames).
    side.ordered(b"".join(raws if as_read else fr.without_end_stream(raws)), out)
    call = hooked.Hooked(sid, path, headers, stages, window=conn.backend_windows.send, as_read=as_read,
                         request_ended=end_stream)
    conn.start_timing(sid, path)
    conn.hooked[sid] = call
    conn.sizes_in.tracker(sid)  # made now: without one, its DATA goes nowhere (client_data)
    conn.sizes_out.tracker(sid)
    conn.unary_open.add(sid)
    conn.busy()
    # The loop's own create_task: ensure_future's checks are four Python calls more per hooked call.
    call.task = asyncio.get_running_loop().create_task(staged.run(conn, call))
    call.task.add_done_callback(lambda _: staged.finish(conn, call))
    if not as_read:
        conn.backend.hold()  # the header block waits for the task's first step (inbound.Corked)


def start_diverted(side: ClientSide, sid: int, path: str, headers: list, raws: list[bytes], end_stream: bool,
           out: list[bytes | memoryview]) -> None:
    """A call the proxy's own server answers starts (divert.py)."""
    conn = side.conn
    # A backend handler must never see a complete (empty) request.
    side.ordered(b"".join(fr.without_end_stream(raws)) + fr.rst_stream(sid, ErrorCode.CANCEL), out)
    call = divert.Diverted(sid, path, headers, window=side.initial_window)
    if end_stream:
        call.ended.set()
    conn.diverted[sid] = call
    conn.busy()
    call.task = asyncio.ensure_future(divert.serve(conn, call))


def request_closed(conn: FrameConnection, sid: int) -> bool:
    """Whether the client ended stream ``sid``'s request (its END_STREAM):
    the stream is half-closed (remote), RFC 9113 5.1, and anything more the
    client sends on it is a stream error. The request's end as the client
    sent it: a hooked call the runtime cut short has none to keep."""
    return _closed(conn.diverted.get(sid), conn.hooked.get(sid))


def _closed(diverted: divert.Diverted | None, held: hooked.Hooked | None) -> bool:
    """``request_closed`` of the stream's calls, looked up already."""
    if diverted is not None:
        return diverted.ended.is_set()
    return held is not None and held.request_ended and not held.cut_short


def client_data(side: ClientSide, f: fr.Frame, out: list[bytes | memoryview]) -> None:
    """A DATA frame on a stream that is not relayed (``out``: what goes to the backend)."""
    conn = side.conn
    sid = f.stream_id
    call = conn.diverted.get(sid)
    if sid in conn.ended:  # the proxy ended it: the backend never sees the rest
        conn.credit_client(len(f.payload))
        return
    held = conn.hooked.get(sid)
    if _closed(call, held):
        # After the client's END_STREAM: a stream error (RFC 9113 6.1), never more of the request.
        conn.credit_client(len(f.payload))
        side.stream_error(sid, out, ErrorCode.STREAM_CLOSED)
        return
    if held is not None:
        _hooked_data(side, held, f, out)
        return
    if call is None:
        if sid == 0 or sid > side.opened:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, f"DATA on idle stream {sid}")
        if sid in side.skipped:  # closed, never open (RFC 9113 5.1.1): as a header block there is (withheld.py)
            raise FrameError(ErrorCode.PROTOCOL_ERROR, f"DATA on stream {sid}, which the client skipped")
        # A stream the backend has ended: what the client still sends on it
        # goes nowhere (the backend would only reset it), and is credited.
        conn.credit_client(len(f.payload))
        return
    size = len(f.payload)
    if len(call.body) <= conn.max_message + 5:
        call.body += fr.unpadded(f)
    if _consumed(side, sid, size, f.has(Flag.END_STREAM)):
        call.ended.set()


def _hooked_data(side: ClientSide, call: hooked.Hooked, f: fr.Frame, out: list[bytes | memoryview]) -> None:
    conn = side.conn
    payload = fr.unpadded(f)
    sizes = conn.sizes_in.get(call.stream_id)
    if sizes is None:  # the backend ended the stream meanwhile: the rest goes nowhere
        conn.credit_client(len(f.payload))
        return
    too_long = sizes.feed(payload)
    if too_long is None and len(call.body) + len(payload) > conn.max_message + 5:
        too_long = len(call.body) + len(payload)  # a unary request is one message
    if too_long is not None:
        call.cancel("request too long")
        side.refuse_size(f, too_long, out)
        return
    call.body += payload
    if call.as_read and f.has(Flag.END_STREAM):
        out.extend(staged.as_read_frames(conn, call))  # with this read's frames
    if _consumed(side, call.stream_id, len(f.payload), f.has(Flag.END_STREAM)):
        call.end_request()


def _consumed(side: ClientSide, sid: int, size: int, end_stream: bool) -> bool:
    """DATA the proxy took, never seen by the backend: it credits the client
    itself. Whether it ended the request (the caller then says so to its call)."""
    side.conn.credit_client(size)
    if not end_stream and size:
        side.conn.out.control(fr.window_update(sid, size))
    return end_stream
