"""batchresource's start reads its state dir off the event loop, in the
state files' thread (hooks.batchresource.writer): a slow disk holds no other
coroutine of the loop, and a write asked meanwhile lands after the read."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from hooks.batchresource import state as statemodule
from hooks.batchresource.pods import KnownPods
from hooks.batchresource.state import PodRecord, SavedPod, StateDir
from hooks.errors import HookServerError
from runtimeproxy.host import socketlock

from .hookfixtures import POD_PARENT, make_hook
from .stalleddisk import STALL, writer_threads

WAIT = 10.0  # at most, for what must happen: a failure, not a hang


class StalledRead:
    """The state dir's file reads (state._read) made to block until
    :meth:`free`; each read's start and end and each save's start recorded,
    in the order they happened, whatever thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.disk, self.reading, self.stalled_out = threading.Event(), threading.Event(), threading.Event()
        self.events: list[str] = []
        real_read, real_save = statemodule._read, StateDir.save

        def read(path: Path) -> SavedPod:
            self.events.append(f"read {path.name}")
            self.reading.set()
            if not self.disk.wait(STALL):
                self.stalled_out.set()  # nothing freed the disk meanwhile: the loop was blocked
            self.events.append(f"read {path.name} ended")
            return real_read(path)

        def save(state: StateDir, record: PodRecord, *args: Any, **kwargs: Any) -> None:
            self.events.append(f"save {record.uid}")
            real_save(state, record, *args, **kwargs)

        monkeypatch.setattr(statemodule, "_read", read)
        monkeypatch.setattr(StateDir, "save", save)

    def free(self) -> None:
        self.disk.set()


def _saved(tmp_path: Path, uid: str, spec: str = "{}") -> PodRecord:
    record = PodRecord(uid, "team-a", f"job-{uid}", POD_PARENT, spec)
    StateDir(tmp_path / "state").save(record)
    return record


async def test_a_start_whose_state_read_stalls_leaves_the_loop_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read of a pod file stalled, another coroutine of the loop runs,
    and the hook does not serve before the read ended (the listener opens
    once the state is read). Before: the files were read on the loop, which
    a stalled disk held (every coroutine of the process, a signal's stop
    among them) until the read ended."""
    _saved(tmp_path, "uid-1")
    stalled = StalledRead(monkeypatch)
    hook = make_hook(tmp_path)
    starting = asyncio.ensure_future(hook.start())
    try:
        # This coroutine runs on while the read is stalled (a loop the read
        # held would resume it only once the read gave up: stalled_out).
        assert await asyncio.to_thread(stalled.reading.wait, WAIT)
        await asyncio.sleep(0)
        assert (stalled.stalled_out.is_set(), starting.done(), hook.serving) == (False, False, False)
        stalled.free()
        await asyncio.wait_for(starting, WAIT)
        assert hook.serving and "uid-1" in hook.pods
    finally:
        stalled.free()
        await asyncio.wait_for(asyncio.gather(starting, return_exceptions=True), WAIT)
        await hook.stop(0, drain=0)
    assert not stalled.stalled_out.is_set()


async def test_a_save_asked_during_the_load_lands_after_its_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save asked while the load reads (a pod told then, and one saved
    again) waits for the read to end: the load's read and a write never run
    at once, and the pod told stays as told, its file the newer one
    (one thread, first in first out; a read in a thread of its own would
    race the save)."""
    _saved(tmp_path, "uid-1", '{"old": true}')
    stalled = StalledRead(monkeypatch)
    pods = KnownPods(make_hook(tmp_path).config)
    loading = asyncio.ensure_future(pods.load())
    try:
        assert await asyncio.to_thread(stalled.reading.wait, WAIT)
        told = PodRecord("uid-1", "team-a", "job-uid-1", POD_PARENT, '{"new": true}')
        other = PodRecord("uid-2", "team-a", "job-uid-2", POD_PARENT, "{}")
        saves = [pods.remember(told), pods.remember(other)]
        assert all(s is not None for s in saves)
        stalled.free()
        await asyncio.wait_for(loading, WAIT)
        await asyncio.wait_for(pods.settled(), WAIT)
    finally:
        stalled.free()
        await asyncio.wait_for(asyncio.gather(loading, return_exceptions=True), WAIT)
    assert stalled.events == ["read uid-1.json", "read uid-1.json ended", "save uid-1", "save uid-2"]
    assert pods.record("uid-1") == told and pods.record("uid-2") == other
    assert json.loads((tmp_path / "state" / "uid-1.json").read_text())["spec"] == '{"new": true}'


class LockReleases:
    """SocketLock.release recorded in ``events``; :attr:`released` set at each."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, events: list[str]) -> None:
        self.released = asyncio.Event()
        real_release = socketlock.SocketLock.release

        def release(lock: socketlock.SocketLock) -> None:
            events.append("lock released")
            self.released.set()
            real_release(lock)

        monkeypatch.setattr(socketlock.SocketLock, "release", release)


async def test_a_stop_during_the_start_s_state_read_returns_and_the_lock_waits_for_the_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop during the start's stalled read cancels the start and returns
    without waiting for the read (a hung disk must not hold a stop, nor
    ``hook run``'s signal path); the socket's lock goes only once the read
    (and its removal of temporary files) has ended, so no read of this
    instance runs while the next one writes; a start again meanwhile is
    refused; the read's thread is then joined. Before: the stop waited for
    the read, however long."""
    _saved(tmp_path, "uid-1")
    before = set(threading.enumerate())
    stalled = StalledRead(monkeypatch)
    releases = LockReleases(monkeypatch, stalled.events)
    hook = make_hook(tmp_path)
    starting = asyncio.ensure_future(hook.start())
    try:
        assert await asyncio.to_thread(stalled.reading.wait, WAIT)
        await asyncio.wait_for(hook.stop(0, drain=0), WAIT)  # the read still stalled
        assert isinstance(starting.exception(), HookServerError) and not hook.serving  # (cancelled by the stop)
        assert (stalled.stalled_out.is_set(), stalled.events) == (False, ["read uid-1.json"])
        with pytest.raises(HookServerError, match="keeps its socket's lock"):
            await hook.start()
        stalled.free()
        await asyncio.wait_for(releases.released.wait(), WAIT)
    finally:
        stalled.free()
        await asyncio.wait_for(asyncio.gather(starting, return_exceptions=True), WAIT)
    assert stalled.events == ["read uid-1.json", "read uid-1.json ended", "lock released"]
    assert not stalled.stalled_out.is_set()
    assert writer_threads(before) == set()  # joined before the lock went


async def test_a_start_again_after_one_cut_during_its_read_serves_with_one_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop during the start's read, then start() again once the read
    ended: it serves, reads uid-1, with one state files' thread, which its
    stop lets go (none left once it ended). Guards the start again after a cut load (it
    served before the cut read's change too, the stop then waiting for the
    read)."""
    _saved(tmp_path, "uid-1")
    before = set(threading.enumerate())
    stalled = StalledRead(monkeypatch)
    releases = LockReleases(monkeypatch, stalled.events)
    hook = make_hook(tmp_path)
    starting = asyncio.ensure_future(hook.start())
    stopping = None
    try:
        assert await asyncio.to_thread(stalled.reading.wait, WAIT)
        stopping = asyncio.ensure_future(hook.stop(0, drain=0))
        await asyncio.wait({starting}, timeout=WAIT)
        stalled.free()
        await asyncio.wait_for(stopping, WAIT)
        await asyncio.wait_for(releases.released.wait(), WAIT)
        await asyncio.wait_for(hook.start(), WAIT)
        assert hook.serving and "uid-1" in hook.pods
        assert len(writer_threads(before)) == 1
    finally:
        stalled.free()
        await asyncio.wait_for(asyncio.gather(starting, return_exceptions=True), WAIT)
        if stopping is not None:
            await asyncio.wait_for(asyncio.gather(stopping, return_exceptions=True), WAIT)
        await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
    for thread in writer_threads(before):  # let go, idle, by the stop (no save): it ends on its own
        await asyncio.to_thread(thread.join, WAIT)
    assert writer_threads(before) == set()


async def test_a_failed_state_read_lets_its_thread_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A load whose read raised (a bug: unreadable files are skipped) lets
    the state files' thread go: none stays idle after a failed start.
    Before: it stayed until a later stop or the process's exit."""
    before = set(threading.enumerate())

    def load(state: StateDir) -> dict[str, SavedPod]:
        raise RuntimeError("a bug in the read")

    monkeypatch.setattr(StateDir, "load", load)
    pods = KnownPods(make_hook(tmp_path).config)
    with pytest.raises(RuntimeError, match="a bug in the read"):
        await pods.load()
    for thread in writer_threads(before):
        await asyncio.to_thread(thread.join, WAIT)
    assert writer_threads(before) == set()


async def test_a_load_cut_during_its_read_leaves_the_pods_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pods closed by a stop, a start's load cut during its read: they stay
    closed (the lock goes once the read ended, maybe to the next instance),
    so a pod told then is not saved; a load that reads opens them. Before:
    the load opened them before its read, a cut one leaving them open
    without the lock."""
    stalled = StalledRead(monkeypatch)
    _saved(tmp_path, "uid-1")
    pods = KnownPods(make_hook(tmp_path).config)
    pods.close()
    loading = asyncio.ensure_future(pods.load())
    try:
        assert await asyncio.to_thread(stalled.reading.wait, WAIT)
        loading.cancel()
        await asyncio.wait({loading}, timeout=WAIT)
        assert loading.cancelled() and pods.closed
        assert pods.remember(PodRecord("uid-2", "team-a", "job-uid-2", POD_PARENT, "{}")) is None
    finally:
        stalled.free()
        await asyncio.wait_for(asyncio.gather(loading, return_exceptions=True), WAIT)
        await asyncio.wait_for(pods.settled(), WAIT)
    await asyncio.wait_for(pods.load(), WAIT)
    assert not pods.closed and "uid-1" in pods
    assert not (tmp_path / "state" / "uid-2.json").exists()


async def test_a_cut_load_whose_read_then_fails_logs_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A load cut during its read, the read then raising (a bug): nobody
    awaits it any more, so its failure is logged at warning, once the read
    ended. Before: asyncio's "Future exception was never retrieved", at
    best, whenever the future was collected."""
    stalled = StalledRead(monkeypatch)
    _saved(tmp_path, "uid-1")
    real_load = StateDir.load

    def load(state: StateDir) -> dict[str, SavedPod]:
        real_load(state)
        raise RuntimeError("a bug in the read")

    monkeypatch.setattr(StateDir, "load", load)
    pods = KnownPods(make_hook(tmp_path).config)
    joined: list[asyncio.Future[Any]] = []
    loading = asyncio.ensure_future(pods.load(joined.append))
    try:
        assert await asyncio.to_thread(stalled.reading.wait, WAIT)
        loading.cancel()
        await asyncio.wait({loading}, timeout=WAIT)
        assert loading.cancelled() and len(joined) == 1
    finally:
        stalled.free()
    await asyncio.wait_for(asyncio.wait(set(joined)), WAIT)  # (the read's outcome reached the loop before)
    failed = [r for r in caplog.records if r.getMessage() == "batchresource's state dir load failed after its start was cut"]
    assert [getattr(r, "error", None) for r in failed] == ["RuntimeError('a bug in the read')"]
