"""A transport a frames connection writes to, for tests: what it was given, unsent."""

from __future__ import annotations


class Transport:
    """Records each write (``written``); reads are never paused for real."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def writelines(self, pieces: list[bytes]) -> None:  # one write, as uvloop's writev
        self.write(b"".join(pieces))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default  # no socket: the connection's client is unknown (peerid.py)
