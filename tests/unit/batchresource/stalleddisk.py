"""StateDir's writes made to stall on demand, and what else the tests of
batchresource's writer thread watch: its threads, the state file as the
socket's lock goes."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import threading
from collections.abc import AsyncIterator, Callable, Collection
from pathlib import Path
from typing import Any

import pytest

from cri_api.hookapi import api_pb2
from hooks.batchresource.server import BatchResourceHook
from hooks.batchresource.state import PodRecord, StateDir
from runtimeproxy.host import socketlock

from .fakecgroup import make_cgroup
from .hookfixtures import POD_PARENT, make_hook, pod_request
from .learnfixtures import TWO
from .specs import BE

STALL = 3.0  # a stalled write gives up past this: the loop it blocked lets the test fail, not hang
WAIT = 10.0  # at most, for what must happen: a failure, not a hang
OTHER = "/kubepods/besteffort/poduid-2"  # uid-2's pod cgroup
THREAD = "batchresource-state"  # the writer's thread name prefix


class StalledDisk:
    """StateDir.save made to block, for the saves ``stalls`` picks, until
    :meth:`free`; each save and removal recorded as it starts; with
    ``removal_fails``, a removal raises OSError (EIO) instead."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, stalls: Callable[[PodRecord, Any], bool],
                 *, removal_fails: bool = False) -> None:
        self.disk, self.writing, self.stalled_out = threading.Event(), threading.Event(), threading.Event()
        self.landed = threading.Event()  # a stalled save has landed
        # Each write as it starts: (the save's spec, or "remove"; its thread; a stalled save landed before it).
        self.started: list[tuple[str, int, bool]] = []
        real_save, real_remove = StateDir.save, StateDir.remove

        def save(state: StateDir, record: PodRecord, containers: Any = None, **kwargs: Any) -> None:
            self.started.append((record.spec, threading.get_ident(), self.landed.is_set()))
            stalled = stalls(record, containers)
            if stalled:
                self.writing.set()
                if not self.disk.wait(STALL):
                    self.stalled_out.set()  # nothing freed the disk meanwhile: the loop was blocked
            real_save(state, record, containers, **kwargs)
            if stalled:
                self.landed.set()

        def remove(state: StateDir, uid: str) -> None:
            self.started.append(("remove", threading.get_ident(), self.landed.is_set()))
            if removal_fails:
                raise OSError(errno.EIO, "Input/output error")
            real_remove(state, uid)

        monkeypatch.setattr(StateDir, "save", save)
        monkeypatch.setattr(StateDir, "remove", remove)

    def free(self) -> None:
        self.disk.set()


def writer_threads(before: Collection[threading.Thread] = ()) -> set[threading.Thread]:
    """The state files' threads alive now, but those in ``before``."""
    return {t for t in threading.enumerate() if t.name.startswith(THREAD) and t not in before}


def containers_at_release(monkeypatch: pytest.MonkeyPatch, path: Path) -> tuple[list[object], asyncio.Event]:
    """socketlock.release spied: at each release, the containers of the
    state file at ``path`` (None: no such key) appended to the list, then
    the event set; a release of a lock not held is appended as
    ``("not held", lock)``, so a test expecting one release sees any other."""
    at_release: list[object] = []
    released = asyncio.Event()
    real_release = socketlock.release

    def release(lock: socketlock.SocketLock | None) -> None:
        held = lock is not None and lock.held
        at_release.append(json.loads(path.read_text()).get("containers") if held else ("not held", lock))
        released.set()
        real_release(lock)

    monkeypatch.setattr(socketlock, "release", release)
    return at_release, released


@contextlib.asynccontextmanager
async def uid_2_first_save_stalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, uid_1_saved: bool = True, removal_fails: bool = False
) -> AsyncIterator[tuple[BatchResourceHook, StalledDisk, asyncio.Task[api_pb2.PodSandboxHookResponse | None]]]:
    """A hook (uid-1's pod known and saved first, with ``uid_1_saved``) whose
    first PreRunPodSandbox for uid-2 (``first``) is under way, its save
    stalled (``StalledDisk``: uid-2's saves stall) once it starts, which the
    body waits for (``stalled.writing``). Once the body ends, the disk is
    freed and ``first`` and every write asked are awaited (the disk freed,
    too, when the body raised).
    Every assertion is the test's, ``first``'s answer and
    ``stalled.stalled_out`` included."""
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    make_cgroup(tmp_path / "cgroup", 1, OTHER)
    hook = make_hook(tmp_path)
    if uid_1_saved:
        await hook.pre_run_pod_sandbox(pod_request(BE, TWO))  # known and saved
    stalled = StalledDisk(monkeypatch, lambda record, _: record.uid == "uid-2", removal_fails=removal_fails)
    first = asyncio.ensure_future(hook.pre_run_pod_sandbox(pod_request(BE, TWO, OTHER, uid="uid-2")))
    try:
        yield hook, stalled, first
        stalled.free()
        await asyncio.wait_for(first, WAIT)
        await asyncio.wait_for(hook.pods.settled(), WAIT)
    finally:
        stalled.free()
