"""A socket path's lock file (socketlock.py): one try at taking it, and
what it says of its holder.

Three lines: the holder's pid, to name it in a refusal; ``holder=N``, 16
hex digits drawn at random as it takes the lock, which tell one holder from
the next (a pid may be any other process's in another pid namespace, two
containerised hook servers both pid 1, and a lock file's inode number is
used again at once); and ``stop_s=S``, how long its stop may take once it
stops serving, so that an instance waiting for that stop waits as long as
the holder's grace makes it, not as long as its own. The pid's line is padded with spaces to ``PID_LINE_BYTES``: an
older version read the first 32 bytes as the pid alone (``int(pread(32).strip())``),
and still names this holder after a rollback. A file of an older holder has
the pid alone; one without a readable ``stop_s`` (not written yet, garbled,
not finite, another program's) gives None, and the waiter counts with its
own bound. A ``holder=`` that is not 16 hex digits (garbled) makes the
whole record unread: nothing of it is taken.

pread is not atomic against the holder's pwrite: a read as it writes may
meet part of the old record and part of the new (two holders' nonces mixed,
the pid line alone, as an older holder's file reads, a stop's digits of
both, more than either). So a record is taken only when two reads in a row
give the same bytes, else it is unread for this try. What holds: a record
taken was whole, unless a write stood still part-way through its copy
across both reads. Between the write and the cut that follows it, a longer
record written before shows its end after the new one: of the same
holder's (a longer stop, SocketLock.record_longer_stop), the end of its
stop's line, no field; of a crashed holder's file, its ``stop_s`` where the
new holder records none, gone at the next read after the cut.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from . import unixsocket
from .dirlock import parse_pid

STOP_KEY = "stop_s"
HOLDER_KEY = "holder"
_NONCE = re.compile(r"[0-9a-f]{16}")
PID_LINE_BYTES = 32  # what an older version's reader reads (dirlock's pid reader: a pread of 32 bytes)
_READ_BYTES = 128  # a pid's line and one number: far less
_REMAKE_TRIES = 3  # the lock file's directory, removed again and again as it is made: given up
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a FIFO put there


@dataclass(frozen=True)
class Holder:
    pid: int | None
    stop_s: float | None  # None: not recorded, or not a number of seconds
    nonce: str | None = None  # None: an older holder's file, or not written yet


@dataclass(frozen=True)
class Taken:
    fd: int  # the lock file, flocked, this holder's record written
    nonce: str


@dataclass(frozen=True)
class Held:
    holder: Holder
    identity: object  # which holder: its nonce (an older one's: file and pid); None: no record read


@dataclass(frozen=True)
class Unusable:
    reason: str


def new_nonce() -> str:
    return secrets.token_hex(8)


def write_holder(fd: int, st: os.stat_result, stop_s: float | None, nonce: str) -> None:
    """The pid as this process's namespace sees it, and ``stop_s`` when
    known. Not into a file with other names (a hard link someone made to
    another file must not be overwritten); a file with none (its directory
    removed) is written: it has no other name to overwrite."""
    if st.st_nlink > 1:
        return
    data = holder_text(os.getpid(), stop_s, nonce).encode()
    with contextlib.suppress(OSError):  # written over, then cut: a reader never meets an empty file
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))


def holder_text(pid: int, stop_s: float | None, nonce: str) -> str:
    """The pid's line, ``PID_LINE_BYTES`` long, the nonce, then ``stop_s`` when known."""
    return (f"{pid:<{PID_LINE_BYTES - 1}}\n{HOLDER_KEY}={nonce}\n"
            + (f"{STOP_KEY}={stop_s:g}\n" if stop_s is not None else ""))


def read_holder(fd: int) -> Holder:
    """The record, or ``Holder(None, None)`` when there is none to take:
    not written yet, garbled, or read as it is written (two reads differ)."""
    try:
        data = os.pread(fd, _READ_BYTES, 0)
        if os.pread(fd, _READ_BYTES, 0) != data:
            return Holder(None, None)
        text = data.decode()
    except (OSError, UnicodeDecodeError):
        return Holder(None, None)
    fields: dict[str, str] = {}
    for line in text.splitlines()[1:]:
        key, sep, value = line.partition("=")
        if sep:
            fields.setdefault(key.strip(), value)
    nonce = fields.get(HOLDER_KEY)
    if nonce is not None and not _NONCE.fullmatch(nonce):
        return Holder(None, None)  # garbled
    return Holder(parse_pid(text), _stop_s(fields.get(STOP_KEY)), nonce)


def _stop_s(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    # Not NaN nor infinity: the waiter logs the number, and JSON has neither.
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def try_lock(lockfile: Path, stop_s: float | None) -> Taken | Held | Unusable:
    """One try at the lock file, never waiting: taken (this holder's record
    written), held by another (its record read), or not usable."""
    remade = 0
    while True:
        try:
            fd = os.open(lockfile, _OPEN_FLAGS, 0o600)
        except FileNotFoundError as exc:
            # Its directory was removed (while this one waited, say): made
            # again, as prepare would (the bind needs it too), then locked.
            if remade == _REMAKE_TRIES:
                return Unusable(f"cannot open it: {exc.strerror or exc}")
            remade += 1
            unixsocket.make_directory(lockfile)
            continue
        except OSError as exc:  # EACCES, EROFS, ELOOP (a symlink)...
            return Unusable(f"cannot open it: {exc.strerror or exc}")
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                return Unusable("it is not a regular file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = read_holder(fd)
                os.close(fd)
                # An older holder's record has no nonce: its file and pid tell it.
                old = (st.st_dev, st.st_ino, holder.pid) if holder.pid is not None else None
                return Held(holder, holder.nonce or old)
            except OSError as exc:  # ENOLCK: a file system without flock
                os.close(fd)
                return Unusable(f"cannot lock it: {exc.strerror or exc}")
            if not same_file(lockfile, st):
                os.close(fd)  # its holder removed it as it let go: lock the file there now
                continue
            nonce = new_nonce()
            write_holder(fd, st, stop_s, nonce)
            return Taken(fd, nonce)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise


def same_file(path: Path, st: os.stat_result) -> bool:
    """Whether ``path`` still names the file ``st`` is of (its holder may
    have removed it as it let go)."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)
