"""One owner at a time for a `--local-containerd` directory.

Two runs on one directory would share one containerd socket: the second's
containerd waits on the first's bolt database lock while the second talks to
the first's containerd over that socket, and its clean-up then stops the
first's pods and kills its shims. So a run first takes an exclusive flock on
DIR/runtime-proxy.lock and holds it, through the open descriptor, until it
stops. The kernel drops it when the holder dies however it dies (SIGKILL
too), so no stale lock outlives its run. The holder's pid is written into the
file only to name it in the refusal.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from .process import HostProcessError

log = logging.getLogger(__name__)

LOCK_NAME = "runtime-proxy.lock"


class DirectoryInUse(HostProcessError):
    """Another process holds the directory's lock."""

    def __init__(self, directory: Path, holder: int | None) -> None:
        self.directory = directory
        self.holder = holder
        who = f"pid {holder}" if holder is not None else "pid unknown"
        super().__init__(
            f"{directory} is in use by another runtime-proxy ({who}, holding {directory / LOCK_NAME}); "
            "its containerd and pods are left alone: stop that run first, or choose another directory")


@dataclass
class DirectoryLock:
    """The held lock on ``directory``; ``release`` (or the process ending) gives it up."""

    directory: Path
    _fd: int | None = field(default=None, repr=False)

    @property
    def path(self) -> Path:
        return self.directory / LOCK_NAME

    @classmethod
    def acquire(cls, directory: Path) -> DirectoryLock:
        """Take the lock at once or raise :class:`DirectoryInUse` (never waits:
        the other run may hold it for days)."""
        lock = cls(directory)
        # Never unlinked, and opened without O_TRUNC: every run must lock the
        # same file, and the holder's pid must survive a refused open.
        fd = os.open(lock.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise DirectoryInUse(directory, holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        lock._fd = fd
        log.debug("directory locked", extra={"lock": str(lock.path), "pid": os.getpid()})
        return lock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the lock up; idempotent. The file stays (see ``acquire``), emptied
        so that it names nobody."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor of the open file drops the flock


def _read_pid(fd: int) -> int | None:
    """The pid a lock's holder wrote into its lock file."""
    try:
        return parse_pid(os.pread(fd, 32, 0).decode())
    except (OSError, ValueError):
        return None  # not ours


def parse_pid(text: str) -> int | None:
    """The pid on the first line of a lock file (socketlock's has more lines)."""
    try:
        return int(text.split("\n", 1)[0].strip())
    except ValueError:
        return None  # not written yet (between its flock and its write), or not ours
