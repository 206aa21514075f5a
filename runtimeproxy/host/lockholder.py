"""What a socket path's lock file says of its holder (socketlock.py).

Two lines: the holder's pid, to name it in a refusal, and ``stop_s=S``, how
long its stop may take once it stops serving, so that an instance waiting
for that stop waits as long as the holder's grace makes it, not as long as
its own. A file of an older holder has the pid alone; one without a
readable ``stop_s`` (not written yet, garbled, another program's) gives
None, and the waiter counts with its own bound.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from .dirlock import parse_pid

STOP_KEY = "stop_s"
_READ_BYTES = 128  # a pid and one number: far less


@dataclass(frozen=True)
class Holder:
    pid: int | None
    stop_s: float | None  # None: not recorded, or not a number of seconds


def write_holder(fd: int, st: os.stat_result, stop_s: float | None) -> None:
    """The pid as this process's namespace sees it, and ``stop_s`` when
    known. Not into a file with other names (a hard link someone made to
    another file must not be overwritten)."""
    if st.st_nlink != 1:
        return
    text = f"{os.getpid()}\n" + (f"{STOP_KEY}={stop_s:g}\n" if stop_s is not None else "")
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)


def read_holder(fd: int) -> Holder:
    try:
        text = os.pread(fd, _READ_BYTES, 0).decode()
    except (OSError, UnicodeDecodeError):
        return Holder(None, None)
    return Holder(parse_pid(text), _stop_s(text))


def _stop_s(text: str) -> float | None:
    for line in text.splitlines()[1:]:
        key, sep, value = line.partition("=")
        if sep and key.strip() == STOP_KEY:
            try:
                seconds = float(value)
            except ValueError:
                return None
            return seconds if seconds >= 0 else None  # NaN too; infinity is capped by the waiter
    return None
