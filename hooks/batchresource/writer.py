"""The thread batchresource's state files are written in, one write at a time, in the order asked.

A write fsyncs (the file, maybe its directory): well under a millisecond on
a local disk, tens on a loaded or network one, unbounded on a stalled one.
On the hook's event loop it would hold every hook call and pass meanwhile,
so the writes run in a thread. One thread, first in first out, rather than
one per write: a pod's writes land in the order they were asked (a save, its
removal, a newer save), so an older copy of a pod never lands after a newer
one. Each write is handed a copy made on the loop as it is asked
(:class:`~.state.SavedPod`): the thread reads nothing of the hook's.

The stop's last saves (:meth:`StateWriter.last`) run on the event loop's
default executor: they first join the writer's thread (every write asked
before them lands first), then save. asyncio.run joins that executor as it
ends, while its loop still runs: the future the stop keeps its socket's
lock on ends (the lock goes), and the done callbacks of the earlier writes
run (a pod's "forgotten" line, a removal's failure). A future of the
writer's own executor would not end: asyncio drops the outcome of an
executor's future whose loop has closed, so a stop whose saves outlived
asyncio.run would keep its lock in that process for good.

A write asked is never cancelled: the futures are the executor's own, which
a caller waits for through :func:`asyncio.wait` (or :meth:`StateWriter.settled`),
never cancelling them, so a hook call cut by its deadline leaves its save to
land, in order; its outcome is taken in by a done callback, never raised to
the caller.

The start's load reads the state dir in that thread too (:meth:`StateWriter.load`):
a write asked during the read lands after it (no production caller asks
one then: the listener opens, and the background starts, only after the
load; this guards a direct caller). A start cut during the read does not wait
for it: the socket's lock does (the thread joined from the default
executor, as the last saves are).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .state import SavedPod, StateDir

__all__ = ["StateWriter", "Written", "outcome"]

log = logging.getLogger("hooks.batchresource")

T = TypeVar("T")

# A write asked of the thread: its error (OSError, or a ValueError for a uid
# no file can be named after), None once it landed.
Written = asyncio.Future[Exception | None]


class StateWriter:
    def __init__(self, state: StateDir) -> None:
        self.state = state
        self._executor: ThreadPoolExecutor | None = None  # started by load() or a write; let go by last() or a load cut or failed
        self._last: asyncio.Future[Any] | None = None  # the last write asked: it ends after every other

    async def load(self, hand_over: Callable[[asyncio.Future[Any]], object] | None = None) -> dict[str, SavedPod]:
        """The state dir's pods, at a start (:meth:`StateDir.load`), read in
        the thread: a slow disk holds no other coroutine of the loop, and a
        write asked meanwhile lands after the read (first in first out).
        The writes of an earlier start have all ended (its lock waited for
        them), maybe on an event loop now closed: settled() forgets them.
        A start cancelled during the read (a stop) does not wait for it,
        which no cancel cuts: the thread is let go and joined from the
        loop's default executor, whose future is handed over (``hand_over``:
        ``HookServer._keep_lock_until``), so the socket's lock goes only once
        the read (and its removals) has ended, as for the stop's last saves
        (:meth:`last`). A read that failed (ended) lets the thread go."""
        self._last = None
        reading = self._submit(self.state.load)
        try:
            await asyncio.wait({reading})
        except BaseException:  # (cancelled) the read runs on
            reading.add_done_callback(_cut_read_ended)
            executor, self._executor = self._executor, None
            if executor is not None:
                self._last = asyncio.get_running_loop().run_in_executor(None, executor.shutdown)
                if hand_over is not None:  # (else a caller of its own: joined all the same)
                    hand_over(self._last)
            raise
        if reading.exception() is not None:
            self._let_go()
        return reading.result()

    def _let_go(self) -> None:
        """The thread, idle (every write asked has ended), let go."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)

    def _submit(self, write: Callable[[], T]) -> asyncio.Future[T]:
        """Run ``write`` in the thread, after every write asked before it (on the running loop)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batchresource-state")
        future = asyncio.get_running_loop().run_in_executor(self._executor, write)
        self._last = future
        return future

    def save(self, pod: SavedPod, *, sync_dir: bool = True) -> Written:
        return self._submit(functools.partial(_save, self.state, pod, sync_dir))

    def remove(self, uid: str) -> Written:
        written = self._submit(functools.partial(_remove, self.state, uid))
        written.add_done_callback(functools.partial(_removed, uid))
        return written

    def last(self, pods: list[SavedPod]) -> asyncio.Future[None]:
        """The stop's last saves, after every write asked before them, on
        the loop's default executor, which joins the writer's thread first
        (a hook started again, once the lock kept for them was let go,
        starts another). The executor's own future: the stop keeps its
        socket's lock on it until it ends (``hooks.releasestep``), which it
        does even past the stop: asyncio.run joins its default executor
        while its loop runs. An ended one when there is nothing to save nor
        wait for: the writer's thread, idle, is let go, and no default
        executor's thread started for nothing."""
        loop = asyncio.get_running_loop()
        if not pods and (self._last is None or self._last.done()):
            self._let_go()
            saving = loop.create_future()
            saving.set_result(None)
            return saving
        executor, self._executor = self._executor, None
        saving = loop.run_in_executor(None, functools.partial(_drain_then_save, executor, self.state, pods))
        self._last = saving
        return saving

    async def settled(self) -> None:
        """Until every write asked so far has ended (landed or failed); one
        cancelled waiting leaves them running."""
        if self._last is not None:
            await asyncio.wait({self._last})


def _drain_then_save(executor: ThreadPoolExecutor | None, state: StateDir, pods: list[SavedPod]) -> None:
    """In the default executor: every write asked of ``executor`` landed
    (its thread ended), then the stop's last saves of ``pods`` (copies,
    safe in a thread)."""
    if executor is not None:
        executor.shutdown(wait=True)
    for pod in pods:
        if (exc := _save(state, pod, False)) is not None:  # its containers are written again by the next instance's listing
            log.warning("batchresource could not save a pod to its state directory as it stopped",
                        extra={"pod": pod.record.pod, "uid": pod.record.uid, "reason": str(exc)})


def outcome(written: Written, bug: str, **fields: object) -> Exception | None:
    """A write's error, on the loop; a bug's (an exception the write does
    not return) logged as ``bug``, and None."""
    if written.cancelled():
        return None  # (never: a write asked is not cancelled)
    if (raised := written.exception()) is not None:
        log.error(bug, exc_info=raised, extra=fields)
        return None
    return written.result()


def _cut_read_ended(reading: asyncio.Future[Any]) -> None:
    """A cut load's read, which nobody awaits: its failure (a bug: unreadable files are skipped) logged."""
    if not reading.cancelled() and (exc := reading.exception()) is not None:
        log.warning("batchresource's state dir load failed after its start was cut", exc_info=exc,
                    extra={"error": repr(exc)})


def _save(state: StateDir, pod: SavedPod, sync_dir: bool) -> Exception | None:
    """In the thread: the error a tracked pod survives (its caller says it)."""
    try:
        state.save(pod.record, pod.containers, swap=pod.swap, sync_dir=sync_dir)
    except (OSError, ValueError) as exc:
        return exc
    return None


def _remove(state: StateDir, uid: str) -> Exception | None:
    try:
        state.remove(uid)
    except (OSError, ValueError) as exc:
        return exc
    return None


def _removed(uid: str, removed: Written) -> None:
    exc = outcome(removed, "batchresource state file removal failed", uid=uid)
    if exc is not None:
        log.warning("batchresource could not remove a pod from its state directory", extra={"uid": uid, "reason": str(exc)})
