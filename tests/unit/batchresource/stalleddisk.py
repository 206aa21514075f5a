"""StateDir's writes made to stall on demand, and what else the tests of
batchresource's writer thread watch: the state file as the socket's lock
goes."""

from __future__ import annotations

import asyncio
import errno
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hooks.batchresource.state import PodRecord, StateDir
from runtimeproxy.host import socketlock

STALL = 3.0  # a stalled write gives up past this: the loop it blocked lets the test fail, not hang


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


def containers_at_release(monkeypatch: pytest.MonkeyPatch, path: Path) -> tuple[list[object], asyncio.Event]:
    """socketlock.release spied: at each release of a held lock, the
    containers of the state file at ``path`` (None: no such key) appended to
    the list, then the event set."""
    at_release: list[object] = []
    released = asyncio.Event()
    real_release = socketlock.release

    def release(lock: socketlock.SocketLock | None) -> None:
        if lock is not None and lock.held:
            at_release.append(json.loads(path.read_text()).get("containers"))
            released.set()
        real_release(lock)

    monkeypatch.setattr(socketlock, "release", release)
    return at_release, released
