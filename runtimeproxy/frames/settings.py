"""What each side's SETTINGS change on a frames connection (connection.py).

SETTINGS pass end to end, each side's to the other, which acknowledges them
(upstream.py, downstream.py); the proxy reads them on the way, as what one
side announces bounds what the proxy may send it or read from the other: the
largest frame, each side's HPACK table, a stream's first window (the
proxy's own DATA: diverted answers, hooked requests), and the client's
stream limit (the proxy's --max-concurrent-streams, or the runtime's if
lower). A value counts from its ACK where sending more than it allows
before then breaks the peer (frame sizes, windows grown, tables), at once
where less is safe.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from . import frame as fr
from .frame import ErrorCode, FrameError, FrameType, Setting
from .inbound import CLIENT_GRANT

if TYPE_CHECKING:
    from .connection import FrameConnection


def from_client(conn: FrameConnection, values: dict[int, int]) -> None:
    """The client's SETTINGS, on their way to the backend."""
    side = conn.client_side
    tables = conn.client_tables  # the backend's encoder keeps to a smaller one once it acknowledges it
    tables.announced(values.get(Setting.HEADER_TABLE_SIZE))
    conn.backend_side.headers.allow_table_size(tables.relay)
    size = values.get(Setting.MAX_FRAME_SIZE)
    if size is not None and not fr.DEFAULT_MAX_FRAME <= size <= fr.MAX_FRAME_LIMIT:
        raise FrameError(ErrorCode.PROTOCOL_ERROR, f"MAX_FRAME_SIZE {size}")
    conn.client_frames.announced(size)
    if Setting.INITIAL_WINDOW_SIZE in values:
        size = values[Setting.INITIAL_WINDOW_SIZE]
        if size > fr.MAX_WINDOW:
            raise FrameError(ErrorCode.FLOW_CONTROL_ERROR, f"INITIAL_WINDOW_SIZE {size}")
        delta, side.initial_window = size - side.initial_window, size
        for call in conn.diverted.values():
            call.window += delta
            call.opened.set()
        for held in list(conn.hooked.values()):  # a smaller window may stop a held answer
            held.release_if_stalled(size)


def backend_acknowledged(conn: FrameConnection) -> None:
    """The backend's ACK of the client's oldest SETTINGS, on its way to the client
    (behind the DATA framed under the settings it acknowledges)."""
    conn.client_frames.acknowledged()
    table_was = conn.client_tables.acked
    conn.client_tables.acknowledged()  # the blocks after it keep to the client's table size
    if conn.client_tables.acked < table_was:
        conn.client_table_shrunk = True
    conn.backend_side.headers.allow_table_size(conn.client_tables.relay)


def from_backend(conn: FrameConnection, values: dict[int, int], raw: bytes | memoryview) -> None:
    """The backend's SETTINGS (``raw`` as read), on their way to the client,
    which acknowledges them; the first are the client's server preface."""
    before = conn.backend_windows.send
    conn.backend_frames.announced(values.get(Setting.MAX_FRAME_SIZE))
    conn.backend_windows.announced(values.get(Setting.INITIAL_WINDOW_SIZE))
    conn.backend_tables.announced(values.get(Setting.HEADER_TABLE_SIZE))
    conn.client_side.headers.allow_table_size(conn.backend_tables.relay)
    _hooked_windows_moved(conn, before)
    side = conn.backend_side
    # The client sees the proxy's stream limit (--max-concurrent-streams), or the backend's if lower.
    limit = min(values.get(Setting.MAX_CONCURRENT_STREAMS, conn.max_streams), conn.max_streams)
    if not side.preface_sent or Setting.MAX_CONCURRENT_STREAMS in values:
        values[Setting.MAX_CONCURRENT_STREAMS] = limit
        raw = fr.serialize(FrameType.SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in values.items()))
    if side.preface_sent:
        conn.out.control(raw)
    else:  # the client's server preface; its connection window is the proxy's: open it wide
        side.preface_sent = True
        # bytes(): raw is the bytes made above (no preface sent), a no-op that says so
        conn.out.preface(bytes(raw) + fr.window_update(0, CLIENT_GRANT))
        conn.server_prefaced()


def client_acknowledged(conn: FrameConnection) -> None:
    """The client's ACK of the backend's oldest SETTINGS, on its way to the backend."""
    before = conn.backend_windows.send
    conn.backend_frames.acknowledged()
    conn.backend_windows.acknowledged()
    conn.backend_tables.acknowledged()
    conn.client_side.headers.allow_table_size(conn.backend_tables.relay)
    _hooked_windows_moved(conn, before)


def _hooked_windows_moved(conn: FrameConnection, before: int) -> None:
    # A larger window counts once the backend has the ACK ahead of the DATA
    # sent under it: C-core resets a stream (PROTOCOL_ERROR) whose DATA
    # overflows the window it knows acknowledged. A smaller one counts at once.
    delta = conn.backend_windows.send - before
    if delta:
        for call in conn.hooked.values():
            call.window += delta
            call.window_grew()
