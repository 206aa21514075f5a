"""The frames path's private directory (for its internal grpc socket), and the
sweep of those that proxies killed without a stop (SIGKILL, OOM) left behind.

A directory is proven its owner's while that owner lives by an exclusive
``flock`` on the ``owner.lock`` file inside, taken as the directory is made
(before the file has its name) and held open until it is removed: the
kernel drops the lock when the process dies, however it dies. A start removes every directory of the same
name pattern in the same parent that is the proxy user's own (a directory, not
a link, mode 0700) and whose lock it can take: its owner is dead. One whose
lock is held (another proxy, live) is left alone, as is anything it cannot
prove: no lock file (a directory made in the instant before its lock, or
anybody else's), or a lock file that is not a plain file.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "runtime-proxy-frames-"
LOCK_NAME = "owner.lock"


@dataclass
class PrivateDir:
    """A made directory and its held lock (closed, the lock is free)."""

    path: Path
    lock_fd: int

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self.lock_fd)  # after: a sweeping start never sees it unlocked and still there


def make(base: Path) -> PrivateDir:
    """A new 0700 directory in ``base``, locked as its owner's; stale ones are swept first."""
    sweep(base)
    path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))
    try:
        # Locked under another name, then named: a sweeping start never finds
        # the lock file free in the instant before this start takes it.
        fd = os.open(path / f".{LOCK_NAME}", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # (no wait: the file is new, nobody else has it open)
            os.rename(path / f".{LOCK_NAME}", path / LOCK_NAME)
        except OSError:
            os.close(fd)
            raise
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return PrivateDir(path, fd)


def sweep(base: Path) -> list[Path]:
    """Remove the directories in ``base`` left by dead proxies (see the module's
    doc); the removed ones. Never fails a start: what it cannot read it skips."""
    removed: list[Path] = []
    try:
        entries = [entry for entry in os.scandir(base) if entry.name.startswith(PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        path = Path(entry.path)
        if _remove_if_dead(path):
            removed.append(path)
    if removed:
        log.info("frames path: removed private directories left by proxies that did not stop",
                 extra={"dirs": [str(path) for path in removed]})
    return removed


def _remove_if_dead(path: Path) -> bool:
    # Checked through descriptors, not the name: the directory that was
    # checked is the one whose lock is taken, and it is removed only if the
    # name still leads to it (not replaced meanwhile, by a link or otherwise).
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False  # gone, not a directory, or a link
    try:
        info = os.fstat(dir_fd)
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) != 0o700:
            return False
        try:
            fd = os.open(LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        except OSError:
            return False  # no lock file (or a link): nothing proves it dead
        try:
            return _remove_if_unlocked(path, info, fd)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def _remove_if_unlocked(path: Path, info: os.stat_result, fd: int) -> bool:
    """Remove ``path`` (the directory ``info`` describes) if its lock file ``fd`` can be locked."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            log.info("frames path: cannot check a private directory's owner",
                     extra={"dir": str(path), "error": str(exc)})
        return False  # held: its proxy lives
    try:
        now = os.lstat(path)
    except OSError:
        return False
    if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
        log.info("frames path: a private directory was replaced while checked; left alone",
                 extra={"dir": str(path)})
        return False
    shutil.rmtree(path, ignore_errors=True)  # while holding its lock: no other start takes it meanwhile
    return not path.exists()
