"""The SETTINGS of a frames connection: what this server announces, and what it keeps of its peer's."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import hpack

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import ErrorCode, FrameError, FrameType, Setting

# Granted to each stream (SETTINGS) and to the connection: a 16 MiB hook
# request flows without a round trip per window. A stream still sending gets
# its window back after every read; the connection once CREDIT_BATCH of it
# is used (a WINDOW_UPDATE per small call would be a write, and a wake-up of
# the proxy, of its own).
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 16 << 20
CREDIT_BATCH = CONNECTION_WINDOW // 4
MAX_STREAMS = 256  # SETTINGS_MAX_CONCURRENT_STREAMS: a hook client needs a handful
MAX_HEADER_LIST = 64 * 1024  # SETTINGS_MAX_HEADER_LIST_SIZE, and what the decoder accepts
_HPACK_DEFAULT_TABLE = 4096


def announcement() -> bytes:
    """This server's SETTINGS and connection window, its first bytes on a connection."""
    settings = b"".join(
        struct.pack(">HI", key, value)
        for key, value in (
            (Setting.MAX_CONCURRENT_STREAMS, MAX_STREAMS),
            (Setting.INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            (Setting.MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST),
        )
    )
    return fr.serialize(FrameType.SETTINGS, 0, 0, settings) + fr.window_update(0, CONNECTION_WINDOW - fr.DEFAULT_WINDOW)


@dataclass
class PeerSettings:
    """What the peer announced that this side's sending must follow."""

    initial_window: int = fr.DEFAULT_WINDOW
    max_frame: int = fr.DEFAULT_MAX_FRAME

    def apply(self, values: dict[int, int], encoder: hpack.Encoder) -> int:
        """Take a SETTINGS frame's ``values``; returns how far every open stream's window moves (section 6.9.2)."""
        if values.get(Setting.ENABLE_PUSH, 0) > 1:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH neither 0 nor 1")
        table = values.get(Setting.HEADER_TABLE_SIZE)
        if table is not None:  # the peer's decoder holds this much: the encoder stays within it
            encoder.header_table_size = min(table, _HPACK_DEFAULT_TABLE)
        max_frame = values.get(Setting.MAX_FRAME_SIZE)
        if max_frame is not None:
            if not fr.DEFAULT_MAX_FRAME <= max_frame <= fr.MAX_FRAME_LIMIT:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {max_frame} out of range")
            self.max_frame = max_frame
        window = values.get(Setting.INITIAL_WINDOW_SIZE)
        if window is None:
            return 0
        if window > fr.MAX_WINDOW:
            raise FrameError(ErrorCode.FLOW_CONTROL_ERROR, f"INITIAL_WINDOW_SIZE {window} over 2^31-1")
        delta, self.initial_window = window - self.initial_window, window
        return delta


def grown(window: int, delta: int) -> int:
    """A send window after a WINDOW_UPDATE or a SETTINGS change; past 2^31-1 is the peer's error."""
    window += delta
    if window > fr.MAX_WINDOW:
        raise FrameError(ErrorCode.FLOW_CONTROL_ERROR, f"flow-control window past 2^31-1 ({window})")
    return window
