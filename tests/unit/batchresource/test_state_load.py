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
from .stalleddisk import STALL

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


async def test_a_start_cancelled_during_its_state_read_keeps_the_lock_until_the_read_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop during the start's stalled read cancels the start, which lets
    the socket's lock go only once the read (and its removal of temporary
    files) has ended: no read of this instance runs while the next one
    writes. The stop returns once the start has ended. Fails with the read
    on the loop: the start cannot be cancelled during it, the read runs to
    its end and the hook serves."""
    _saved(tmp_path, "uid-1")
    stalled = StalledRead(monkeypatch)
    real_release = socketlock.SocketLock.release

    def release(lock: socketlock.SocketLock) -> None:
        stalled.events.append("lock released")
        real_release(lock)

    monkeypatch.setattr(socketlock.SocketLock, "release", release)
    hook = make_hook(tmp_path)
    starting = asyncio.ensure_future(hook.start())
    stopping: asyncio.Future[None] | None = None
    try:
        assert await asyncio.to_thread(stalled.reading.wait, WAIT)
        stopping = asyncio.ensure_future(hook.stop(0, drain=0))
        for _ in range(10):  # the stop has cancelled the start by then; the read still stalled
            await asyncio.sleep(0)
        assert (stalled.stalled_out.is_set(), starting.done(), stopping.done()) == (False, False, False)
        assert "lock released" not in stalled.events
        stalled.free()
        await asyncio.wait_for(stopping, WAIT)
        assert isinstance(starting.exception(), HookServerError) and not hook.serving  # (cancelled by the stop)
    finally:
        stalled.free()
        await asyncio.wait_for(asyncio.gather(starting, return_exceptions=True), WAIT)
        if stopping is not None:
            await asyncio.wait_for(asyncio.gather(stopping, return_exceptions=True), WAIT)
    assert stalled.events == ["read uid-1.json", "read uid-1.json ended", "lock released"]
    assert not stalled.stalled_out.is_set()
