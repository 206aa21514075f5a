"""What a hook server allows the proxy: its SETTINGS, and the connection's send window."""

from __future__ import annotations

from collections.abc import Iterable

from ..frames import frame as fr
from ..frames.frame import ErrorCode, FrameError, Setting
from .stream import Stream


class ServerLimits:
    def __init__(self) -> None:
        self.max_frame = fr.DEFAULT_MAX_FRAME
        self.stream_window = fr.DEFAULT_WINDOW  # each new call's send window
        self.max_streams: int | None = None
        self.send_window = fr.DEFAULT_WINDOW

    def settings(self, payload: bytes | memoryview, open_streams: Iterable[Stream]) -> dict[int, int]:
        """A SETTINGS frame's values, applied; a new INITIAL_WINDOW_SIZE moves
        the open calls' windows too, below 0 if need be (RFC 9113 section
        6.9.2). Bad values are connection errors."""
        values = fr.settings(payload)
        for key, value in values.items():
            if key == Setting.INITIAL_WINDOW_SIZE:
                if value > fr.MAX_WINDOW:
                    raise FrameError(ErrorCode.FLOW_CONTROL_ERROR, f"INITIAL_WINDOW_SIZE {value}")
                delta, self.stream_window = value - self.stream_window, value
                for stream in open_streams:
                    stream.window += delta
                    if stream.window > fr.MAX_WINDOW:
                        raise FrameError(ErrorCode.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE takes a window over 2^31-1")
            elif key == Setting.MAX_FRAME_SIZE:
                if not fr.DEFAULT_MAX_FRAME <= value <= fr.MAX_FRAME_LIMIT:
                    raise FrameError(ErrorCode.PROTOCOL_ERROR, f"MAX_FRAME_SIZE {value}")
                self.max_frame = value
            elif key == Setting.MAX_CONCURRENT_STREAMS:
                self.max_streams = value
            elif key == Setting.ENABLE_PUSH and value != 0:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, f"ENABLE_PUSH {value} from a server")  # section 6.5.2
            # HEADER_TABLE_SIZE: our requests never add to the dynamic table (connection.py says it is empty).
        return values

    def grow(self, increment: int) -> None:
        """A WINDOW_UPDATE on the connection."""
        if increment == 0:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0 on the connection")
        self.send_window += increment
        if self.send_window > fr.MAX_WINDOW:
            raise FrameError(ErrorCode.FLOW_CONTROL_ERROR, "connection window over 2^31-1")

    def full(self, open_streams: int) -> bool:
        """Whether another call must wait for one of these to end."""
        return self.max_streams is not None and open_streams >= self.max_streams
