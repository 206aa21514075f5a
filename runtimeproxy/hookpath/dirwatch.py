"""Watching a hook directory: change events, a periodic safety rescan, and a
directory that is missing, removed or replaced.

The watcher only says *when* to rescan and *what* changed (events, and
:func:`file_identity` for the periodic rescan); reading files is the
registry's job (:mod:`.registry`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Rescan", "WatchSettings", "directory_fingerprint", "file_identity", "watch_directory"]

# The registry's logger: an operator finds the directory's whole story in one place.
logger = logging.getLogger(__package__ + ".registry")

# Rescan(None): re-read every file; Rescan(names): re-read those and any file
# whose stat changed (an empty set is the periodic safety rescan).
Rescan = Callable[[frozenset[str] | None], object]


@dataclass(frozen=True)
class WatchSettings:
    debounce_ms: int = 100
    step_ms: int = 50
    resync_interval: float = 2.0  # seconds between periodic safety rescans
    dir_poll_interval: float = 0.25  # seconds between checks for a missing directory
    error_backoff: float = 1.0


# How long the watcher's thread waits for a change before it returns (and is
# called again at once): see watch_directory.
WATCH_THREAD_TIMEOUT_MS = 60_000


class ThreadStop:
    """The watcher thread's stop flag, as awatch takes one (``is_set``, ``set``).

    Its thread calls ``is_set`` at every ``step_ms`` (20 times a second,
    idle or not): here a list's ``__len__``, a C call, where an
    ``asyncio.Event``'s is a Python method, a frame of the interpreter each
    time (350 of the 1,350 instructions a step costs the thread, under
    callgrind). The list is only ever appended to, under the GIL: a reader in
    another thread sees it empty or not, nothing in between."""

    def __init__(self) -> None:
        self._flag: list[bool] = []
        self.is_set: Callable[[], int] = self._flag.__len__  # truthy once set

    def set(self) -> None:
        if not self._flag:
            self._flag.append(True)


def _directory_identity(directory: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(directory)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _path_state(directory: Path) -> object:
    """What is at ``directory`` while it is no directory: missing, a file (which), an error."""
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:  # ENOTDIR: a file in its path; EACCES...
        return exc.errno
    return (stat.S_IFMT(st.st_mode), st.st_dev, st.st_ino)


def file_identity(path: Path | str) -> tuple[object, ...] | None:
    """What must be unchanged for a file's last parse to still hold (None: unknown).

    With its ctime: a file rewritten in place at the same size with its mtime
    put back (cp -p, rsync --inplace -t, tar x) changes nothing else, and no
    call can set a ctime back (it comes with the same stat: no extra syscall)."""
    try:
        st = os.lstat(path)  # one syscall for a regular file
        link = stat.S_ISLNK(st.st_mode)
        if link:
            st = os.stat(path)
        identity: tuple[object, ...] = (
            st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_mode, st.st_uid,
        )
        if link:  # the target, and its directory's safety, may change
            target = os.path.realpath(path)
            parent = os.stat(os.path.dirname(target))
            identity += (target, parent.st_ino, parent.st_ctime_ns, parent.st_mode, parent.st_uid)
    except OSError:
        return None
    return identity


def directory_fingerprint(directory: Path) -> tuple[object, ...] | None:
    """What must be unchanged for a rescan that read no file to find all the
    same again (None: unknown): the directory's stat (its safety, and
    whether it was replaced), its entries' names, and the stat identity of
    every one that may be a hook file. A few syscalls, no parsing, no logging:
    what the periodic safety rescan costs while nothing changes."""
    try:
        st = os.stat(directory)
        with os.scandir(directory) as it:  # (as list_hook_files lists it: the same errors)
            names = sorted(entry.name for entry in it)
    except OSError:
        return None
    base = os.fspath(directory)
    files = []
    for name in names:
        if name.endswith(".json") and not name.startswith("."):  # list_hook_files' candidates and more
            identity = file_identity(os.path.join(base, name))
            if identity is None:
                return None
            files.append(identity)
    return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_mtime_ns, st.st_ctime_ns, tuple(names), tuple(files))


async def watch_directory(directory: Path, rescan: Rescan, settings: WatchSettings, stop: asyncio.Event) -> None:
    """Call ``rescan`` on every change of ``directory`` until ``stop`` is set.

    Uses ``watchfiles.awatch`` (debounce ``debounce_ms``), plus a periodic
    safety rescan every ``resync_interval`` seconds (catches changes made
    while the watcher was being set up and edits of symlink targets outside
    the directory).  A missing directory is waited for by polling its
    existence every ``dir_poll_interval`` seconds (rescanning when what is
    there changes: a file in its place, or none); a directory that is deleted
    or replaced is re-watched, with a full rescan.  Errors are logged, never raised.
    """
    from watchfiles import awatch  # local import: only the watcher needs it

    while not stop.is_set():
        # What the rescan reads, taken before it: a change between the two
        # (a file in its place removed) is then a change the poll below sees.
        seen = _path_state(directory)
        rescan(None)
        identity = _directory_identity(directory)
        if identity is None:
            # Missing, or not a directory: wait for it to appear, rescanning
            # as what is there changes (a file in its place keeps the last
            # good hooks; removed, they go).
            while not stop.is_set() and _directory_identity(directory) is None:
                await _wait_or_timeout(stop, settings.dir_poll_interval)
                state = _path_state(directory)
                if state != seen and _directory_identity(directory) is None:
                    seen = state
                    rescan(None)
            continue
        # awatch sets its stop event when cancelled; give it its own so that
        # cancelling the watch does not set the caller's event.
        watcher_stop = ThreadStop()
        bridge = asyncio.create_task(_propagate(stop, watcher_stop))
        # The safety rescan on a timer of the loop's: each turn of awatch's
        # loop (a task group, a worker thread's call, a cancel scope that formats
        # its task's repr) cost more than the rescan of an unchanged directory.
        resync = asyncio.create_task(_resync(directory, identity, rescan, settings.resync_interval, watcher_stop))
        changes = awatch(
            directory,
            watch_filter=None,  # any change (e.g. a ConfigMap's ..data swap) triggers a rescan
            debounce=settings.debounce_ms,
            step=settings.step_ms,  # how often the watcher's thread looks at its stop event
            # awatch is typed for an anyio, asyncio or trio Event, but calls
            # only is_set and set on it (watchfiles 0.21 to 1.x; pyproject
            # bounds the version): a ThreadStop is one for its purposes.
            # (unused-ignore: without trio installed, its Event and so the union is Any.)
            stop_event=watcher_stop,  # type: ignore[arg-type, unused-ignore]
            # Its thread returns once a minute with nothing to yield, not only on
            # a change or its stop event: anyio's worker threads are not daemons,
            # and a loop closed without cancelling this watch would otherwise
            # hang the interpreter's exit until the directory changed.
            rust_timeout=WATCH_THREAD_TIMEOUT_MS,
            yield_on_timeout=False,
            recursive=False,
        )
        try:
            async for batch in changes:
                rescan(frozenset(Path(p).name for _, p in batch))
                if _directory_identity(directory) != identity:
                    break
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("watching hook directory %s failed; retrying", directory, extra={"hook_dir": str(directory)})
            await _wait_or_timeout(stop, settings.error_backoff)
        finally:
            watcher_stop.set()
            bridge.cancel()
            resync.cancel()
            await changes.aclose()  # release the inotify watch now, not at GC time
        # Logged here, once: the timer and an event may both have seen it.
        if not stop.is_set() and _directory_identity(directory) != identity:
            logger.info(
                "hook directory %s was removed or replaced; re-watching", directory, extra={"hook_dir": str(directory)},
            )


async def _resync(
    directory: Path, identity: tuple[int, int], rescan: Rescan, interval: float, watcher_stop: ThreadStop
) -> None:
    """The periodic safety rescan (an empty set) every ``interval`` while the
    directory is the one watched; once it is not, the watcher is stopped (the
    watch then starts again, on what is there now)."""
    while True:
        await asyncio.sleep(interval)
        try:
            rescan(frozenset())
        except Exception:  # the next one may do better: the timer must not stop
            logger.exception("periodic rescan of %s failed", directory, extra={"hook_dir": str(directory)})
        if _directory_identity(directory) != identity:
            watcher_stop.set()  # (watch_directory logs it)
            return


async def _propagate(source: asyncio.Event, target: ThreadStop) -> None:
    await source.wait()
    target.set()


async def _wait_or_timeout(event: asyncio.Event, timeout: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        pass
